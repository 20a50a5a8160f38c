"""Reward for the unit-conversion example: the final answer in metres, to 0.1 %."""

from __future__ import annotations


def score(completion: str, answer: float | None = None, **row) -> float:
    try:
        value = float(completion.strip().removesuffix("m").strip())
    except ValueError:
        return 0.0
    return float(answer is not None and abs(value - answer) <= 1e-3 * abs(answer))
