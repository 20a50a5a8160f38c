"""What a training run returns."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class RunResult:
    run_dir: Path
    history: list[dict[str, float]]  # one dict per logged step, as in metrics.jsonl
    final_model: str | None  # HF directory of the final policy


class RunError(RuntimeError):
    """The run cannot usefully go on (e.g. every update is NaN); the message says why
    and what to change."""
