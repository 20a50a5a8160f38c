"""The learning rate over a run's optimizer steps: a linear warm-up, then constant,
or a linear or cosine decay to a floor (``trainer.lr_schedule``,
``trainer.lr_min_ratio``). Every training engine takes its schedule from here."""

from __future__ import annotations

import math

SCHEDULES = ("constant", "linear", "cosine")


def lr_factor(
    step: int,
    warmup: int,
    schedule: str = "constant",
    decay_steps: int = 0,
    min_ratio: float = 0.0,
) -> float:
    """The multiple of the base learning rate for optimizer step ``step`` (0-based).

    Warm-up: ``min(1, (step + 1) / (warmup + 1))`` (the first step is not at 0).
    Then ``constant`` stays at 1; ``linear`` and ``cosine`` decay from 1 at the end
    of the warm-up to ``min_ratio`` at step ``decay_steps`` (the run's last) and stay
    there: with p the share of the decay done, ``1 - p`` or ``(1 + cos(pi p)) / 2``,
    scaled into ``[min_ratio, 1]``.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"lr_schedule={schedule!r}: expected one of {', '.join(SCHEDULES)}")
    warmup = max(warmup, 0)
    if step < warmup or schedule == "constant":
        return min(1.0, (step + 1) / (warmup + 1))
    p = min(1.0, (step - warmup) / max(1, decay_steps - warmup))
    decayed = 1.0 - p if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * p))
    return min_ratio + (1.0 - min_ratio) * decayed
