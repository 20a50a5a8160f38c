"""Preference pairs: rows in TRL's preference format, parsed into one form, and the
pairwise batch the trainer takes.

Legend: b = samples (chosen and rejected rows of each pair, interleaved), t = tokens.

A row holds ``chosen`` and ``rejected`` and, optionally, ``prompt``:

- explicit prompt, plain text: ``{"prompt": "2+2=", "chosen": "4", "rejected": "5"}``.
  As everywhere in rlpost a text prompt is one user message and a text
  completion the assistant's reply, rendered with the chat template (TRL's
  standard format joins raw text instead);
- explicit prompt, conversational: ``prompt`` a list of messages, ``chosen`` and
  ``rejected`` lists of messages (usually one assistant message);
- implicit prompt: no ``prompt``; ``chosen`` and ``rejected`` are whole
  conversations (or texts) sharing a prefix, which is the prompt.

An optional ``margin`` (a number) is the reward model's margin of the pair.
Every row is parsed into ``{"prompt": [messages], "chosen": [messages],
"rejected": [messages]}`` (other columns kept), so the prompt stream, validation
and the batch see one form.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from rlpost.data.rows import DataError, validate_row
from rlpost.data.samples import conversation_tokens
from rlpost.trainers.batch import TrajectoryBatch, pad_sequences

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

PAIR_COLUMNS = ("chosen", "rejected")


def is_preference_row(row: object) -> bool:
    return isinstance(row, dict) and all(k in row for k in PAIR_COLUMNS)


def check_pair_columns(rows: Sequence[object], source: str) -> None:
    """A ``DataError`` when the rows of ``source`` are not preference rows, naming
    the columns they have."""
    dicts = [r for r in rows if isinstance(r, dict)]
    if not dicts:
        return
    columns = sorted({k for r in dicts for k in r})
    lacking = [i for i, r in enumerate(rows) if isinstance(r, dict) and not is_preference_row(r)]
    if lacking:
        raise DataError(
            f"{source}: preference training (algo=dpo, algo=rm) needs 'chosen' and 'rejected' "
            f"in every row, and optionally 'prompt'; {len(lacking)} of {len(rows)} rows lack "
            f"them (first: row {lacking[0]}); the columns found are {columns}"
        )


def _messages(value: object, role: str, name: str) -> list[dict]:
    """A text (one ``role`` message) or a list of messages, checked."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if not isinstance(value, list) or not value:
        raise ValueError(f"'{name}' must be a string or a non-empty list of messages")
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not {"role", "content"} <= set(m):
            raise ValueError(f"'{name}'[{i}] must be a message with 'role' and 'content'")
    return list(value)


def _common_prefix(chosen: str | list, rejected: str | list) -> int:
    """Length of the shared prefix of two texts or message lists; a text's prefix ends
    before the last space of the shared part, as TRL's ``extract_prompt`` cuts it."""
    n = 0
    for a, b in zip(chosen, rejected):
        if a != b:
            break
        n += 1
    if isinstance(chosen, str) and n < min(len(chosen), len(rejected)):
        space = chosen.rfind(" ", 0, n)
        n = space if space > 0 else n
    return n


def parse_preference_row(row: object) -> dict:
    """``row`` in the one form (see the module docstring); ``ValueError`` saying why not."""
    if not isinstance(row, dict):
        raise ValueError(f"row has type {type(row).__name__}, expected an object")
    if not is_preference_row(row):
        raise ValueError(f"row has no 'chosen' and 'rejected' (fields: {sorted(row)})")
    chosen, rejected = row["chosen"], row["rejected"]
    if "prompt" in row:
        reason = validate_row(row)
        if reason is not None:
            raise ValueError(reason)
        prompt = row["prompt"]
        prompt = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        chosen_m = _messages(chosen, "assistant", "chosen")
        rejected_m = _messages(rejected, "assistant", "rejected")
    else:
        if type(chosen) is not type(rejected) or not isinstance(chosen, str | list):
            raise ValueError(
                "without a 'prompt', 'chosen' and 'rejected' must both be texts or both "
                "lists of messages sharing the prompt as their prefix"
            )
        n = _common_prefix(chosen, rejected)
        if n == 0:
            raise ValueError(
                "'chosen' and 'rejected' share no prefix to take as the prompt; add a 'prompt'"
            )
        if isinstance(chosen, str):
            prompt = [{"role": "user", "content": chosen[:n]}]
            chosen_m = _messages(chosen[n:], "assistant", "chosen")
            rejected_m = _messages(rejected[n:], "assistant", "rejected")
        else:
            prompt = _messages(chosen[:n], "user", "chosen")
            if n == len(chosen) or n == len(rejected):
                raise ValueError("one of 'chosen' and 'rejected' is a prefix of the other")
            chosen_m = _messages(chosen[n:], "assistant", "chosen")
            rejected_m = _messages(rejected[n:], "assistant", "rejected")
    if chosen_m == rejected_m:
        raise ValueError("'chosen' and 'rejected' are the same completion")
    margin = row.get("margin")
    if margin is not None and (isinstance(margin, bool) or not isinstance(margin, int | float)):
        raise ValueError(f"'margin' is {margin!r}, expected a number (or leave it out)")
    return {**row, "prompt": prompt, "chosen": chosen_m, "rejected": rejected_m}


def parse_preference_rows(rows: Sequence[object], source: str) -> tuple[list[dict], list[str]]:
    """The rows of ``source`` parsed, and why the others could not be (one line each)."""
    check_pair_columns(rows, source)
    kept, reasons = [], []
    for i, row in enumerate(rows):
        try:
            kept.append(parse_preference_row(row))
        except ValueError as exc:
            reasons.append(f"row {i}: {exc}")
    return kept, reasons


def completion_tokens(
    tokenizer: PreTrainedTokenizerBase, prompt: list[dict], completion: list[dict]
) -> tuple[list[int], list[int]]:
    """Token ids of prompt + completion under the chat template, and a mask that is 1
    on the completion's assistant tokens only (never on the prompt's turns, which
    may hold earlier assistant messages)."""
    ids, mask = conversation_tokens(tokenizer, prompt + completion)
    prompt_len = len(conversation_tokens(tokenizer, prompt)[0])
    return ids, [0] * prompt_len + mask[prompt_len:]


def preference_batch(tokenizer: PreTrainedTokenizerBase, rows: list[dict]) -> TrajectoryBatch:
    """Parsed pairs as one batch: row 2i is pair i's chosen, row 2i+1 its rejected
    (a contiguous split with an even count keeps pairs whole); ``group_ids_b`` is
    the pair's index, ``scores_b["margin"]`` its margin (0 without one)."""
    ids, masks, margins = [], [], []
    for row in rows:
        for side in PAIR_COLUMNS:
            seq, mask = completion_tokens(tokenizer, row["prompt"], row[side])
            ids.append(seq)
            masks.append(mask)
            margins.append(float(row.get("margin") or 0.0))
    return TrajectoryBatch(
        input_ids_bt=pad_sequences(ids, tokenizer.pad_token_id),
        attention_mask_bt=pad_sequences([[1] * len(s) for s in ids], 0),
        response_mask_bt=pad_sequences(masks, 0),
        group_ids_b=torch.arange(len(rows)).repeat_interleave(2),
        scores_b={"margin": torch.tensor(margins)},
    )


def sampled_pairs(
    rows: list[dict],
    texts: list[list[str]],
    correct: Callable[[str, dict], object],
    answer_of: Callable[[str], str],
    every_wrong: bool = False,
) -> list[dict]:
    """Pairs of a task with a known answer from completions sampled for its prompts:
    chosen = the answer, rejected = the first sampled completion of the prompt that
    ``correct(text, row)`` rejects (prompts whose samples were all right give none);
    ``every_wrong``: one pair per distinct wrong answer instead. ``answer_of(text)``
    is the completion's answer as the task reads it."""
    pairs = []
    for row, samples in zip(rows, texts):
        wrong = list(dict.fromkeys(answer_of(t) for t in samples if not correct(t, row)))
        for answer in wrong if every_wrong else wrong[:1]:
            pairs.append(
                {
                    **row,
                    "prompt": row["prompt"],
                    "chosen": [{"role": "assistant", "content": str(row["answer"])}],
                    "rejected": [{"role": "assistant", "content": answer}],
                }
            )
    return pairs


def near_miss_pairs(rows: list[dict], misses: Callable[[str, str], list[str]]) -> list[dict]:
    """Pairs of a task with a known answer against wrong answers made from it:
    ``misses(answer, other)`` (e.g. ``rlpost.data.tasks.arith.near_misses``) lists
    them, ``other`` being the next row's answer (the first row's for the last)."""
    pairs = []
    for i, row in enumerate(rows):
        other = str(rows[(i + 1) % len(rows)]["answer"])
        for answer in misses(str(row["answer"]), other):
            pairs.append(
                {
                    **row,
                    "chosen": [{"role": "assistant", "content": str(row["answer"])}],
                    "rejected": [{"role": "assistant", "content": answer}],
                }
            )
    return pairs


def raise_if_none(rows: list[dict], source: str, reasons: list[str]) -> None:
    if not rows:
        first = f"; first problem: {reasons[0]}" if reasons else ""
        raise DataError(f"{source}: no usable preference pairs{first}")
