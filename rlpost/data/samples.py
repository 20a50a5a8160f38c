"""Turn prompt rows and generations into token ids and a ``TrajectoryBatch``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rlpost.data.images import row_images
from rlpost.data.rows import prompt_messages
from rlpost.rollout.base import Completion, GenerationResult
from rlpost.trainers.batch import TrajectoryBatch, pad_sequences

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from rlpost.models.vl_inputs import ImageInputs


def chat_text(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict], generation_prompt: bool
) -> str:
    """``messages`` rendered by the chat template (with the assistant header when
    ``generation_prompt``)."""
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt
    )
    assert isinstance(text, str)  # tokenize=False: one conversation renders as one text
    return text


def encode_prompt(tokenizer: PreTrainedTokenizerBase, row: dict) -> list[int]:
    """Chat-template the row's prompt (with the assistant header) into token ids."""
    text = chat_text(tokenizer, prompt_messages(row), True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def rollout_batch(
    results: list[GenerationResult], pad_id: int, multiple: int = 1
) -> TrajectoryBatch:
    """One row per completion, grouped by prompt (group id = prompt index).

    A multi-turn episode's completion carries its own mask (environment tokens 0)
    and may carry its own prompt. The earlier segments of an agent program's split
    trajectory (``Completion.segments``) follow every completion's row, in the
    group of their episode, with ``owner_b`` naming the episode's row; the batch is
    then padded with empty rows to a multiple of ``multiple`` (the ranks times the
    mini-batches) when the extra rows broke it."""
    ids, resp, logps, groups, owners = [], [], [], [], []

    def add(prompt: list[int], c: Completion, g: int, owner: int) -> None:
        ids.append(prompt + c.token_ids)
        resp.append([0] * len(prompt) + (c.mask if c.mask is not None else [1] * len(c.token_ids)))
        logps.append([0.0] * len(prompt) + c.logprobs)
        groups.append(g)
        owners.append(owner)

    later: list[tuple[int, int, Completion]] = []
    for g, res in enumerate(results):
        for c in res.completions:
            later += [(len(ids), g, s) for s in c.segments or []]
            add(c.prompt_ids if c.prompt_ids is not None else res.prompt_ids, c, g, len(ids))
    for owner, g, s in later:
        assert s.prompt_ids is not None
        add(s.prompt_ids, s, g, owner)
    if later:
        while len(ids) % multiple:  # an empty row: no response token, not a sample
            ids.append(ids[0][:1])
            resp.append([0])
            logps.append([0.0])
            groups.append(groups[0])
            owners.append(-1)
    input_ids = pad_sequences(ids, pad_id)
    width = input_ids.shape[1]
    return TrajectoryBatch(
        input_ids_bt=input_ids,
        attention_mask_bt=pad_sequences([[1] * len(s) for s in ids], 0),
        response_mask_bt=pad_sequences(resp, 0),
        rollout_logp_bt=torch.tensor([lp + [0.0] * (width - len(lp)) for lp in logps]),
        group_ids_b=torch.tensor(groups),
        owner_b=torch.tensor(owners) if later else None,
    )


def episode_rows(values_b: torch.Tensor, batch: TrajectoryBatch) -> torch.Tensor:
    """A per-episode value (one per completion, in ``rollout_batch``'s order) for every
    row of ``batch``: an episode's segments get its value, padding rows zero."""
    if batch.owner_b is None:
        return values_b
    out_b = values_b[batch.owner_b.clamp(min=0)]
    return torch.where(batch.owner_b >= 0, out_b, torch.zeros_like(out_b))


def _tokens(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def conversation_tokens(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict]
) -> tuple[list[int], list[int]]:
    """Token ids of a chat and a mask that is 1 on every assistant turn's content and
    end-of-turn tokens (what the model must learn to say) and 0 elsewhere.

    Each turn's tokens are the difference between the templated conversation up
    to that turn and up to the turn before, so the chat template decides the
    layout; this assumes the template renders a conversation's prefix as a prefix.
    """
    ids: list[int] = []
    mask: list[int] = []
    for i, message in enumerate(messages):
        before = _tokens(tokenizer, _render(tokenizer, messages[:i], False)) if i else []
        upto = _tokens(tokenizer, _render(tokenizer, messages[: i + 1], False))
        if message["role"] == "assistant":
            header = _tokens(tokenizer, _render(tokenizer, messages[:i], True))
            ids += header[len(before) :]
            mask += [0] * (len(header) - len(before))
            ids += upto[len(header) :]
            mask += [1] * (len(upto) - len(header))
        else:
            ids += upto[len(before) :]
            mask += [0] * (len(upto) - len(before))
    return ids, mask


def _render(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict], generation_prompt: bool
) -> str:
    if not messages:
        return chat_text(tokenizer, [], True) if generation_prompt else ""
    return chat_text(tokenizer, messages, generation_prompt)


def sft_batch(
    tokenizer: PreTrainedTokenizerBase, rows: list[dict], image_inputs: ImageInputs | None = None
) -> TrajectoryBatch:
    """Supervised targets, loss on what the assistant says only.

    A row holds either ``messages`` (a whole, possibly multi-turn, conversation:
    every assistant turn is a target) or a ``prompt`` and a ``response`` (the
    response and the end token are the target). With ``image_inputs`` (a VL
    model's ``rlpost.models.vl_inputs.ImageInputs``) a prompt's images are expanded
    into their tokens and carried by the batch.
    """
    ids, resp = [], []
    mm: list[dict] = []
    for row in rows:
        if image_inputs is not None and row.get("images"):
            text = chat_text(tokenizer, prompt_messages(row), True)
            prompt, images = image_inputs.encode(text, row_images(row))
            target = _tokens(tokenizer, row["response"]) + [tokenizer.eos_token_id]
            ids.append(prompt + target)
            resp.append([0] * len(prompt) + [1] * len(target))
            mm.append(images)
            continue
        if "messages" in row:
            seq, mask = conversation_tokens(tokenizer, row["messages"])
            ids.append(seq)
            resp.append(mask)
            continue
        prompt = encode_prompt(tokenizer, row)
        target = _tokens(tokenizer, row["response"]) + [tokenizer.eos_token_id]
        ids.append(prompt + target)
        resp.append([0] * len(prompt) + [1] * len(target))
    if mm and len(mm) != len(rows):
        raise ValueError("an SFT batch mixes rows with and without images")
    return TrajectoryBatch(
        input_ids_bt=pad_sequences(ids, tokenizer.pad_token_id),
        attention_mask_bt=pad_sequences([[1] * len(s) for s in ids], 0),
        response_mask_bt=pad_sequences(resp, 0),
        mm_inputs_b=mm or None,
    )
