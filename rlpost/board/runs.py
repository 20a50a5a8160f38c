"""Run directories under the runs root: what each one is, how far it got, and
whether it is still going.

A run directory is a folder holding ``config.yaml`` or ``metrics.jsonl`` (or the
``board.json`` the board writes when it launches one), found at most two levels
below the root. Status, in order of evidence:

- a process or Ray job the board launched tells it directly (running, or its
  exit code: 0 finished, 130/143 stopped, anything else failed);
- ``final/`` exists, or the last logged step reached ``trainer.total_steps``:
  finished;
- ``metrics.jsonl`` written within ``RECENT_S``: running;
- the board's log of the run ends in an error: failed, with that line;
- a checkpoint short of ``total_steps``: stopped (resumable);
- otherwise unknown (no recent metrics, no checkpoint, no log).

A stopped or failed run also names its latest complete checkpoint, the one
``trainer.resume=auto`` continues from.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import yaml

from rlpost.board.paths import relative
from rlpost.loop.tracking import first_and_last

RECENT_S = 120.0
MAX_DEPTH = 2
LOG_NAME = "board.log"  # the launched run's stdout and stderr
LAUNCH_NAME = "board.json"  # how the board launched it (command, pid or job id)
MARKERS = ("config.yaml", "metrics.jsonl", LAUNCH_NAME)
STOP_CODES = (130, 143)  # 128 + SIGINT, 128 + SIGTERM: checkpointed and stopped (faults.py)
# A complete checkpoint: checkpoints/step_N holding COMPLETE (rlpost/loop/checkpoint.py;
# a save in progress is step_N.partial).
CHECKPOINT_DIR = re.compile(r"^step_(\d+)$")
# A row of ``metrics.jsonl`` as JSON reads it back: its ``step`` an int (``read_metrics``
# keeps only such rows), its other values whatever the file holds (floats, the text of
# one that is not finite).
MetricsRow = dict[str, Any]


class LaunchRecord(TypedDict, total=False):
    """``board.json``: how the board launched a run (``rlpost.board.launch``)."""

    kind: str  # local or ray
    command: list[str]
    started: float
    pid: int  # local
    job_id: str  # ray
    address: str  # ray: the cluster's dashboard
    exit_code: int  # once known
    shown: str  # the command line the launch page showed
    # read where a record has them (the board writes neither)
    total_steps: int
    algo: str


@dataclass
class Run:
    """One run directory, as the runs page lists it."""

    rel: str
    path: Path
    algo: str = "?"
    model: str = "?"
    data: str = "?"
    total_steps: int | None = None
    step: int | None = None
    status: str = "unknown"
    error: str | None = None
    headline: tuple[str, float, float] | None = None  # key, first, last
    modified: float = 0.0
    launch: LaunchRecord = field(default_factory=LaunchRecord)
    checkpoint: tuple[int, str] | None = None  # (step, path in the run dir), stopped or failed


def latest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    """(step, directory) of the run's newest complete checkpoint, or None."""
    found = []
    try:
        children = list((run_dir / "checkpoints").iterdir())
    except OSError:
        return None
    for p in children:
        m = CHECKPOINT_DIR.match(p.name)
        if m and (p / "COMPLETE").is_file():
            found.append((int(m.group(1)), p))
    return max(found, default=None)


def find_runs(root: Path, max_depth: int = MAX_DEPTH) -> list[Path]:
    """Run directories under ``root`` (itself included), newest first. Does not
    look inside a run directory, nor follow a symlink out of the root."""
    base = root.resolve()
    found: list[Path] = []

    def visit(folder: Path, depth: int) -> None:
        if any((folder / m).is_file() for m in MARKERS):
            found.append(folder)
            return
        if depth >= max_depth:
            return
        try:
            children = sorted(p for p in folder.iterdir() if p.is_dir())
        except OSError:
            return
        for child in children:
            resolved = child.resolve()
            if resolved == base or base in resolved.parents:
                visit(child, depth + 1)

    if base.is_dir():
        visit(base, 0)
    return sorted(found, key=_modified, reverse=True)


def _modified(path: Path) -> float:
    stamps = [(path / m).stat().st_mtime for m in MARKERS if (path / m).exists()]
    return max(stamps, default=0.0)


_METRICS_CACHE: dict[Path, tuple[tuple[int, int], list[MetricsRow]]] = {}


def read_metrics(run_dir: Path) -> list[MetricsRow]:
    """The rows of ``metrics.jsonl`` (a resumed run's redone steps: the last row of
    a step wins), cached until the file changes. A half-written last line is
    skipped."""
    path = run_dir / "metrics.jsonl"
    try:
        st = path.stat()
    except FileNotFoundError:
        return []
    key = (st.st_mtime_ns, st.st_size)
    cached = _METRICS_CACHE.get(path)
    if cached and cached[0] == key:
        return cached[1]
    by_step: dict[int, MetricsRow] = {}
    with open(path) as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                by_step[row["step"]] = row
    rows = [by_step[s] for s in sorted(by_step)]
    _METRICS_CACHE[path] = (key, rows)
    return rows


_CONFIG_CACHE: dict[Path, tuple[tuple[int, int], dict[str, object]]] = {}


def read_config(run_dir: Path) -> dict[str, object]:
    """The run's ``config.yaml`` (empty when absent or unreadable), cached until it changes."""
    path = run_dir / "config.yaml"
    try:
        st = path.stat()
    except FileNotFoundError:
        return {}
    key = (st.st_mtime_ns, st.st_size)
    cached = _CONFIG_CACHE.get(path)
    if cached and cached[0] == key:
        return cached[1]
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        raw = None
    cfg = raw if isinstance(raw, dict) else {}
    _CONFIG_CACHE[path] = (key, cfg)
    return cfg


def read_launch(run_dir: Path) -> LaunchRecord:
    path = run_dir / LAUNCH_NAME
    try:
        record: LaunchRecord = json.loads(path.read_text())  # as the board wrote it
    except (OSError, json.JSONDecodeError):
        return {}
    return record if isinstance(record, dict) else {}


def headline(rows: list[MetricsRow]) -> tuple[str, float, float] | None:
    """The run's headline figure (``rlpost.loop.tracking.headline``, as its final line
    and curves.png have it): its key, first and last logged value."""
    return first_and_last(rows)


def last_error(log: Path, tail_bytes: int = 65536) -> str | None:
    """The last line of ``log`` that reports an error (``error: ...`` from the CLI,
    or an exception's ``SomethingError: ...`` line)."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, log.stat().st_size - tail_bytes))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        text = line.strip()
        head = text.split(":", 1)[0]
        if text.startswith("error:") or (
            ":" in text and " " not in head and head.endswith(("Error", "Exception"))
        ):
            return text
    return None


def detect_status(
    run_dir: Path,
    rows: list[MetricsRow],
    total_steps: int | None,
    exit_code: int | None = None,
    alive: bool | None = None,
    now: float | None = None,
) -> tuple[str, str | None]:
    """(status, error line) of a run: see the module docstring for the order.
    ``alive``/``exit_code`` come from a process the board launched (None: not
    known)."""
    log = run_dir / LOG_NAME
    if alive:
        return "running", None
    if exit_code is not None:
        if exit_code == 0:
            return "finished", None
        if exit_code in STOP_CODES:
            return "stopped", None
        return "failed", last_error(log) or f"exit code {exit_code}"
    last_step = rows[-1]["step"] if rows else None
    if (run_dir / "final").is_dir() or (
        total_steps is not None and last_step is not None and last_step >= total_steps
    ):
        return "finished", None
    metrics = run_dir / "metrics.jsonl"
    now = time.time() if now is None else now
    if alive is None and metrics.exists() and now - metrics.stat().st_mtime < RECENT_S:
        return "running", None
    error = last_error(log) if log.exists() else None
    if error:
        return "failed", error
    if latest_checkpoint(run_dir) is not None:
        return "stopped", None
    return "unknown", None


def describe_run(
    root: Path, run_dir: Path, exit_code: int | None = None, alive: bool | None = None
) -> Run:
    """Everything the runs page shows about ``run_dir``."""
    cfg = read_config(run_dir)
    launch = read_launch(run_dir)
    rows = read_metrics(run_dir)

    def pick(group: str, *keys: str) -> object:
        node = cfg.get(group) or {}
        for key in keys:
            if isinstance(node, dict) and node.get(key) not in (None, "", []):
                return node[key]
        return None

    total = pick("trainer", "total_steps")
    if total is None and launch.get("total_steps") is not None:
        total = launch["total_steps"]
    data = pick("data", "train_files", "name")
    if isinstance(data, list):
        data = ", ".join(map(str, data))
    run = Run(
        rel=relative(root, run_dir),
        path=run_dir,
        algo=str(pick("algo", "name") or launch.get("algo") or "?"),
        model=str(pick("model", "path", "preset") or "?"),
        data=str(data or "?"),
        total_steps=int(total) if isinstance(total, int) else None,
        step=rows[-1]["step"] if rows else None,
        headline=headline(rows),
        modified=_modified(run_dir),
        launch=launch,
    )
    run.status, run.error = detect_status(run_dir, rows, run.total_steps, exit_code, alive)
    if run.status in ("stopped", "failed"):
        latest = latest_checkpoint(run_dir)
        if latest is not None:
            run.checkpoint = (latest[0], latest[1].relative_to(run_dir).as_posix())
    return run
