"""Prompt rows from files, validated, served as an endless seeded stream.

A row is a dict with a ``"prompt"``: either a string (one user message) or a
list of chat messages ``{"role": str, "content": str | list}``. Any other
keys (``"answer"``, ``"data_source"``, ...) travel with the row to the reward
function untouched.
"""

from __future__ import annotations

import glob
import json
import logging
import random
from collections.abc import Sequence
from pathlib import Path

from rlpost.data.curriculum import Curriculum
from rlpost.data.images import check_images, resolve_paths

logger = logging.getLogger(__name__)

ACCEPTED_SUFFIXES = (".jsonl", ".json", ".parquet")


class DataError(ValueError):
    """A data file or row cannot be used; the message says what to change."""


def expand_paths(paths: list[str]) -> list[Path]:
    """``data.*_files`` entries as files and folders: a glob (``train-*.parquet``)
    stands for its matches in sorted order and must match something."""
    out: list[Path] = []
    for entry in paths:
        if any(c in entry for c in "*?["):
            matches = sorted(Path(p) for p in glob.glob(entry))
            if not matches:
                raise DataError(f"{entry}: the pattern matches no file; check the path")
            out += matches
        else:
            out.append(Path(entry))
    return out


def load_rows(path: str | Path) -> list[dict]:
    """Read rows from ``.jsonl`` / ``.json`` (one object per line, or one
    top-level array), ``.parquet``, or a folder written by ``datasets``'
    ``save_to_disk`` (one split). Rows are not validated here."""
    path = Path(path)
    if path.is_dir():
        rows = _read_saved_dataset(path)
        resolve_paths(rows, path)
        return rows
    if path.suffix not in ACCEPTED_SUFFIXES:
        raise DataError(
            f"{path}: unsupported file type {path.suffix!r}; "
            f"accepted: {', '.join(ACCEPTED_SUFFIXES)}"
        )
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    rows = _read_rows(path)
    resolve_paths(rows, path.parent)  # a row's image paths are relative to its file
    return rows


def _read_saved_dataset(path: Path) -> list[dict]:
    """The rows of a ``Dataset.save_to_disk`` folder: its Arrow shards, in the
    order its ``state.json`` lists them (read with pyarrow, as ``datasets``
    writes them: Arrow IPC streams)."""
    import pyarrow as pa

    if (path / "dataset_dict.json").is_file():
        splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
        raise DataError(
            f"{path}: a folder of several splits ({', '.join(splits)}); name one, e.g. "
            f"data.train_files=[{path / (splits[0] if splits else 'train')}]"
        )
    state = path / "state.json"
    if not state.is_file():
        raise DataError(
            f"{path}: a folder without state.json is not a dataset saved with "
            "datasets' save_to_disk; give its .jsonl / .parquet files (a glob works too)"
        )
    shards = [f["filename"] for f in json.loads(state.read_text()).get("_data_files", [])]
    rows: list[dict] = []
    for name in shards:
        with pa.memory_map(str(path / name)) as source:
            rows += pa.ipc.open_stream(source).read_all().to_pylist()
    return rows


def _read_rows(path: Path) -> list[dict]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: invalid JSON array: {e}") from e
        return list(rows)
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{lineno}: invalid JSON line: {e.msg}") from e
    return rows


# Optional per-row limits of a single-turn completion's length, within rollout.*'s.
LENGTH_COLUMNS = ("max_tokens", "min_tokens")


def validate_row(row: object, needs_prompt: bool = True) -> str | None:
    """Why ``row`` cannot be used as a prompt, or None when it can. Without
    ``needs_prompt`` (an ``agent.program`` builds its own messages from the row) a
    row without a ``prompt`` is whole; one it has is still checked."""
    if not isinstance(row, dict):
        return f"row has type {type(row).__name__}, expected an object with a 'prompt' field"
    if "prompt" not in row and not needs_prompt:
        return _check_lengths(row) or check_images(row)
    if "prompt" not in row:
        return (
            f"row has no 'prompt' field (fields: {sorted(row)}); name the column that holds "
            "it with data.prompt_key=<column>, or build it from the row's fields with "
            "data.prompt_template (an agent.program takes rows without one: it gets the whole row)"
        )
    reason = _check_lengths(row)
    if reason is not None:
        return reason
    prompt = row["prompt"]
    if isinstance(prompt, str):
        return check_images(row) if prompt else "'prompt' is an empty string"
    if not isinstance(prompt, list):
        return f"'prompt' has type {type(prompt).__name__}, expected a string or a list of messages"
    if not prompt:
        return "'prompt' is an empty list of messages"
    for i, message in enumerate(prompt):
        if not isinstance(message, dict):
            return (
                f"'prompt'[{i}] has type {type(message).__name__}, expected {{'role', 'content'}}"
            )
        missing = [k for k in ("role", "content") if k not in message]
        if missing:
            return f"'prompt'[{i}] lacks {missing}"
        if not isinstance(message["role"], str):
            return f"'prompt'[{i}]['role'] has type {type(message['role']).__name__}, expected str"
        # A list of content parts is the multimodal form ({"type": "image", ...}).
        if not isinstance(message["content"], str | list):
            return (
                f"'prompt'[{i}]['content'] has type {type(message['content']).__name__}, "
                "expected a string or a list of content parts"
            )
    return check_images(row)


def _check_lengths(row: dict) -> str | None:
    for key in LENGTH_COLUMNS:
        value = row.get(key)
        if value is not None and (type(value) is not int or value < 0):
            return f"'{key}' is {value!r}, expected a whole number >= 0 (or leave it out)"
    return None


def prompt_messages(row: dict) -> list[dict]:
    """The row's prompt as chat messages; a string is one user message."""
    prompt = row["prompt"]
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return prompt


class PromptStream:
    """Endless, seeded, epoch-shuffled stream of valid rows; malformed rows are
    dropped at load and counted (``self.num_malformed``), never silently.

    Each epoch visits every valid row once in an order that depends only on
    ``(seed, epoch)``; a batch may span two epochs. ``state_dict`` holds the
    epoch and position, so a resumed stream continues with the exact rows an
    uninterrupted one would have produced.
    """

    def __init__(
        self,
        rows: list[dict],
        seed: int,
        batch_size: int,
        source: str = "rows",
        needs_prompt: bool = True,
        curriculum: Curriculum | None = None,
    ):
        """``curriculum``: skip prompts it finds settled (``data.curriculum``; fed by
        ``record``)."""
        if batch_size < 1:
            raise DataError(f"batch_size must be >= 1, got {batch_size}")
        self.rows: list[dict] = []
        reasons: list[str] = []
        for i, row in enumerate(rows):
            reason = validate_row(row, needs_prompt)
            if reason is None:
                self.rows.append(row)
            else:
                reasons.append(f"{source} row {i}: {reason}")
        self.num_malformed = len(reasons)
        if not self.rows:
            first = f"; first problem: {reasons[0]}" if reasons else ""
            raise DataError(f"{source}: no usable rows out of {len(rows)}{first}")
        if reasons:
            logger.warning(
                "%s: skipped %d malformed of %d rows; first: %s",
                source,
                len(reasons),
                len(rows),
                "; ".join(reasons[:3]),
            )
        self.seed = seed
        self.batch_size = batch_size
        self.epoch = 0
        self.position = 0
        self._order = self._permutation(0)
        self.curriculum = curriculum
        self._index = {id(row): i for i, row in enumerate(self.rows)}

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        # A string seed is hashed with SHA-512: stable across processes.
        random.Random(f"{self.seed}/{epoch}").shuffle(order)
        return order

    def next_batch(self) -> list[dict]:
        """The next ``batch_size`` rows, starting a new shuffled epoch as needed."""
        batch: list[dict] = []
        passed = 0  # settled prompts passed over in a row
        while len(batch) < self.batch_size:
            if self.position == len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._permutation(self.epoch)
            i = self._order[self.position]
            c = self.curriculum
            # every prompt settled: take them as they come rather than loop for ever
            if c is None or passed >= len(self.rows) or c.admit(i, self.epoch, self.position):
                batch.append(self.rows[i])
                passed = 0
            else:
                passed += 1
            self.position += 1
        return batch

    def record(self, row: dict, scores: Sequence[float]) -> None:
        """The scores of one group of ``row`` (a row this stream gave out), for the
        curriculum's memory."""
        i = self._index.get(id(row))
        if self.curriculum is not None and i is not None:
            self.curriculum.record(i, scores)

    def replace_rows(self, rows: list[dict]) -> None:
        """Stream ``rows`` instead, from the start of epoch 0 (rows built once the run
        has started, e.g. the preference pairs sampled for ``data=arith_pref``)."""
        if not rows:
            raise DataError("replace_rows: no rows")
        self.rows, self.epoch, self.position = list(rows), 0, 0
        self._order = self._permutation(0)
        self._index = {id(row): i for i, row in enumerate(self.rows)}

    def state_dict(self) -> dict:
        d: dict = {"epoch": self.epoch, "position": self.position, "num_rows": len(self.rows)}
        if self.curriculum is not None:
            d["curriculum"] = self.curriculum.state_dict()
        return d

    def load_state_dict(self, d: dict) -> None:
        if d["num_rows"] != len(self.rows):
            raise DataError(
                f"cannot resume the prompt stream: the checkpoint saw {d['num_rows']} valid rows, "
                f"the data now has {len(self.rows)}; resume with the same data files"
            )
        self.epoch = d["epoch"]
        self.position = d["position"]
        self._order = self._permutation(self.epoch)
        if self.curriculum is not None and "curriculum" in d:
            self.curriculum.load_state_dict(d["curriculum"])
