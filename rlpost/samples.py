"""Turn prompt rows and generations into token ids and a ``TrajectoryBatch``."""

from __future__ import annotations

from typing import Any

import torch

from rlpost.data import prompt_messages
from rollout.base import GenerationResult
from trainers.batch import TrajectoryBatch, pad_sequences


def encode_prompt(tokenizer: Any, row: dict) -> list[int]:
    """Chat-template the row's prompt (with the assistant header) into token ids."""
    text = tokenizer.apply_chat_template(
        prompt_messages(row), tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def rollout_batch(results: list[GenerationResult], pad_id: int) -> TrajectoryBatch:
    """One row per completion, grouped by prompt (group id = prompt index)."""
    ids, resp, logps, groups = [], [], [], []
    for g, res in enumerate(results):
        p = len(res.prompt_ids)
        for c in res.completions:
            ids.append(res.prompt_ids + c.token_ids)
            resp.append([0] * p + [1] * len(c.token_ids))
            logps.append([0.0] * p + c.logprobs)
            groups.append(g)
    input_ids = pad_sequences(ids, pad_id)
    width = input_ids.shape[1]
    return TrajectoryBatch(
        input_ids_bt=input_ids,
        attention_mask_bt=pad_sequences([[1] * len(s) for s in ids], 0),
        response_mask_bt=pad_sequences(resp, 0),
        rollout_logp_bt=torch.tensor([lp + [0.0] * (width - len(lp)) for lp in logps]),
        group_ids_b=torch.tensor(groups),
    )


def sft_batch(tokenizer: Any, rows: list[dict]) -> TrajectoryBatch:
    """Prompt + ``response`` + end token, loss on the response tokens only."""
    ids, resp = [], []
    for row in rows:
        prompt = encode_prompt(tokenizer, row)
        target = tokenizer(row["response"], add_special_tokens=False)["input_ids"]
        target = list(target) + [tokenizer.eos_token_id]
        ids.append(prompt + target)
        resp.append([0] * len(prompt) + [1] * len(target))
    return TrajectoryBatch(
        input_ids_bt=pad_sequences(ids, tokenizer.pad_token_id),
        attention_mask_bt=pad_sequences([[1] * len(s) for s in ids], 0),
        response_mask_bt=pad_sequences(resp, 0),
    )
