"""One timed run of the real CLI for the benchmarks: its output to a log file
beside the run, its wall seconds back, a failed run a clear stop."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed_cli(args: list[str], out: Path, name: str) -> float:
    """``python -m rlpost.main *args`` from the repository root, its output in
    ``out/<name>.log``; returns the wall seconds, exits naming the log on failure."""
    cmd = [sys.executable, "-m", "rlpost.main", *args]
    start = time.perf_counter()
    with open(out / f"{name}.log", "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                              env={**os.environ, "TQDM_DISABLE": "1"})  # fmt: skip
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}); see {out / name}.log")
    return wall
