"""Built-in tasks: prompt sets with a verifiable reward, chosen by name."""

from __future__ import annotations

from typing import Any

from rlpost.tasks.arith import ArithTask
from rlpost.tasks.calc import CalcTask

TASKS: dict[str, type] = {"arith": ArithTask, "calc": CalcTask}


def build_task(name: str, **kwargs: Any) -> Any:
    """Instantiate the task registered as ``name`` with its fields ``kwargs``."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {sorted(TASKS)}")
    return TASKS[name](**kwargs)


__all__ = ["TASKS", "ArithTask", "CalcTask", "build_task"]
