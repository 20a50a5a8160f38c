"""Run the real CLI and read back its metrics."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli_in_process import main_in_process


def run_cli(args: list[str], run_dir: Path, cache: Path) -> list[dict]:
    """``python -m rlpost.main`` (in this process: ``tests/cli_in_process.py``);
    returns its metrics history."""
    proc = main_in_process([*args, f"trainer.run_dir={run_dir}", f"model.cache_dir={cache}"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
