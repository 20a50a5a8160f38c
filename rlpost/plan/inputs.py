"""The run's rows: the built-in task's or the data files', validated, with the
rows dropped counted by cause."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from rlpost.config.groups import PREFERENCE_PRESETS, Config
from rlpost.data.columns import shape_rows
from rlpost.data.images import missing_image_files
from rlpost.data.rows import DataError, expand_paths, load_rows, validate_row

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)


def load_data(cfg: Config) -> tuple[list[dict], list[dict], int]:
    """Train rows, held-out rows and the number of malformed rows dropped."""
    if cfg.data.name == "reasoning_gym":
        from rlpost.data.reasoning_gym import reasoning_gym_rows

        train_rg, val_rg = reasoning_gym_rows(
            cfg.data.reasoning_gym, cfg.data.val_size, cfg.trainer.seed
        )
        return train_rg, val_rg, 0
    if cfg.data.name == "verifiers":
        return verifiers_data(cfg)
    if cfg.data.name != "files":
        from rlpost.data.tasks import build_task, task_name

        task = build_task(
            task_name(cfg.data.name),
            seed=cfg.trainer.seed,
            max_operand=cfg.data.max_operand,
            num_val=cfg.data.val_size,
        )
        rows = task.sft_rows() if cfg.algo.name == "sft" else task.train_rows()
        return rows, task.val_rows(), 0
    if cfg.algo.name in PREFERENCE_PRESETS:
        return load_preference_files(cfg)
    train: list[dict] = []
    val: list[dict] = []
    problems: list[str] = []
    bad = 0
    for key, paths, out in (
        ("train_files", cfg.data.train_files, train),
        ("val_files", cfg.data.val_files, val),
    ):
        try:
            files = expand_paths(list(paths))
        except DataError as exc:
            problems.append(f"data.{key}: {exc}")
            continue
        for path in files:
            try:
                rows = shape_rows(load_rows(path), cfg.data, str(path))
            except DataError as exc:
                problems.append(f"data.{key}: {exc}")
                continue
            if cfg.algo.name == "sft":
                rows = [sft_row(r) for r in rows]
            kept, dropped = _usable_rows(
                rows, f"data.{key}: {path}", problems, needs_prompt=cfg.agent.program is None
            )
            out.extend(kept)
            bad += dropped
    if problems:
        raise DataError("\n  ".join(problems))
    val = val[: cfg.data.val_size]
    if not train:
        raise DataError(f"no valid training rows in {cfg.data.train_files} (see the warnings)")
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


def verifiers_data(cfg: Config) -> tuple[list[dict], list[dict], int]:
    """``data=verifiers``: the tasks of ``agent.program=verifiers:<taskset>``."""
    from rlpost.rollout.agent import verifiers_adapter as va

    if not va.is_verifiers_spec(cfg.agent.program):
        raise DataError(
            f"data.name=verifiers takes its rows from agent.program=verifiers:<taskset>, "
            f"not agent.program={cfg.agent.program}; set it, or use data=files"
        )
    try:
        train, val = va.verifiers_rows(
            cfg.agent.program, dict(cfg.agent.env_kwargs), cfg.data.val_size
        )
    except va.VerifiersError as exc:
        raise DataError(f"data.name=verifiers: {exc}") from None
    return train, val, 0


def load_preference_files(cfg: Config) -> tuple[list[dict], list[dict], int]:
    """``algo=dpo`` / ``algo=rm`` on data files: parsed preference pairs
    (``rlpost.data.preference``); a file without 'chosen' and 'rejected' columns is
    an error naming the columns it has, a malformed pair is dropped and counted."""
    from rlpost.data.preference import parse_preference_rows

    out: dict[str, list[dict]] = {"train_files": [], "val_files": []}
    problems: list[str] = []
    bad = 0
    for key in out:
        try:
            files = expand_paths(list(getattr(cfg.data, key)))
        except DataError as exc:
            problems.append(f"data.{key}: {exc}")
            continue
        for path in files:
            try:
                kept, reasons = parse_preference_rows(load_rows(path), f"data.{key}: {path}")
            except DataError as exc:
                problems.append(str(exc))
                continue
            if reasons:
                log.warning(
                    "data.%s: %s: skipped %d malformed of %d pairs (data/malformed_rows); "
                    "first: %s",
                    key, path, len(reasons), len(reasons) + len(kept), "; ".join(reasons[:3]),
                )  # fmt: skip
            out[key].extend(kept)
            bad += len(reasons)
    if problems:
        raise DataError("\n  ".join(problems))
    for key, rows in out.items():
        if not rows:
            raise DataError(f"data.{key}: no valid preference pairs in {getattr(cfg.data, key)}")
    return out["train_files"], out["val_files"][: cfg.data.val_size], bad


def _usable_rows(
    rows: list[dict], source: str, problems: list[str], needs_prompt: bool = True
) -> tuple[list[dict], int]:
    """The well-formed rows of one file, and how many were not (warned about once,
    naming the file). An image file that is not there is a problem to fix before
    the run starts, not a row to drop. An agent program takes a row without a
    prompt (``needs_prompt=False``): it builds its messages from the row."""
    kept, reasons = [], []
    for i, row in enumerate(rows):
        reason = validate_row(row, needs_prompt)
        if reason is not None:
            reasons.append(f"row {i}: {reason}")
            continue
        missing = missing_image_files(row)
        if missing:
            problems.append(
                f"{source} row {i}: image file {missing[0]!r} does not exist (a relative "
                "path is taken from the data file's folder)"
            )
        kept.append(row)
    if reasons:
        log.warning(
            "%s: skipped %d malformed of %d rows (data/malformed_rows); first: %s",
            source, len(reasons), len(rows), "; ".join(reasons[:3]),
        )  # fmt: skip
    return kept, len(reasons)


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


def drop_long_prompts(
    rows: list[dict], tokenizer: PreTrainedTokenizerBase, limit: int
) -> tuple[list[dict], int]:
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
