"""The run's rows: the built-in task's or the data files', validated, with the
rows dropped counted by cause."""

from __future__ import annotations

import logging
from typing import Any

from rlpost.config.groups import Config
from rlpost.data.rows import DataError, load_rows, validate_row

log = logging.getLogger(__name__)


def load_data(cfg: Config) -> tuple[list[dict], list[dict], int]:
    """Train rows, held-out rows and the number of malformed rows dropped."""
    if cfg.data.name != "files":
        from rlpost.data.tasks import build_task

        task = build_task(
            cfg.data.name,
            seed=cfg.trainer.seed,
            max_operand=cfg.data.max_operand,
            num_val=cfg.data.val_size,
        )
        rows = task.sft_rows() if cfg.algo.name == "sft" else task.train_rows()
        return rows, task.val_rows(), 0
    train: list[dict] = []
    val: list[dict] = []
    problems = []
    for key, paths, out in (
        ("train_files", cfg.data.train_files, train),
        ("val_files", cfg.data.val_files, val),
    ):
        for path in paths:
            try:
                out.extend(load_rows(path))
            except DataError as exc:
                problems.append(f"data.{key}: {exc}")
    if problems:
        raise DataError("\n  ".join(problems))
    if cfg.algo.name == "sft":
        train = [sft_row(r) for r in train]
        val = [sft_row(r) for r in val]
    bad = sum(validate_row(r) is not None for r in val)
    val = [r for r in val if validate_row(r) is None][: cfg.data.val_size]
    if not val:
        raise DataError(f"no valid held-out rows in {cfg.data.val_files}")
    if cfg.algo.name == "sft":
        missing = [i for i, r in enumerate(train) if "response" not in r and "messages" not in r]
        if missing:
            raise DataError(
                "algo=sft needs 'messages' (a chat with assistant turns) or 'prompt' and "
                f"'response' in every training row; rows {missing[:5]} have neither"
            )
    return train, val, bad


def sft_row(row: dict) -> dict:
    """A chat row (``messages``) also gets a ``prompt``: the conversation before its
    last assistant turn, which is what validation asks the model to continue."""
    messages = row.get("messages") if isinstance(row, dict) else None
    if not isinstance(messages, list) or "prompt" in row:
        return row
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
    if not last:
        return row
    return {
        **row,
        "prompt": messages[:last],
        "answer": row.get("answer", messages[last]["content"]),
    }


def drop_long_prompts(rows: list[dict], tokenizer: Any, limit: int) -> tuple[list[dict], int]:
    """Rows whose templated prompt fits ``data.max_prompt_tokens``, and how many did not."""
    from rlpost.data.rows import validate_row
    from rlpost.data.samples import encode_prompt

    kept = [
        r for r in rows if validate_row(r) is not None or len(encode_prompt(tokenizer, r)) <= limit
    ]
    dropped = len(rows) - len(kept)
    if dropped:
        log.warning("dropped %d prompts longer than data.max_prompt_tokens=%d", dropped, limit)
    if not kept:
        raise DataError(f"every prompt is longer than data.max_prompt_tokens={limit}; raise it")
    return kept, dropped
