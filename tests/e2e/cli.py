"""Run the real CLI and read back its metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def run_cli(args: list[str], run_dir: Path, cache: Path, timeout: int = 900) -> list[dict]:
    """Run ``python -m rlpost.main`` and return its metrics history."""
    cmd = [
        sys.executable, "-m", "rlpost.main", *args,
        f"trainer.run_dir={run_dir}", f"model.cache_dir={cache}",
    ]  # fmt: skip
    env = {**os.environ, "TQDM_DISABLE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
