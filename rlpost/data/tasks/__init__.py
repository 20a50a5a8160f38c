"""Built-in tasks: prompt sets with a verifiable reward, chosen by name."""

from __future__ import annotations

import dataclasses
from typing import Any

from rlpost.data.tasks.arith import ArithTask
from rlpost.data.tasks.calc import CalcTask
from rlpost.data.tasks.shapes import ShapesTask

TASKS: dict[str, Any] = {"arith": ArithTask, "calc": CalcTask, "shapes": ShapesTask}
VISION_TASKS = ("shapes",)  # prompts with images: a vision-language model is needed


def build_task(name: str, **kwargs: Any) -> Any:
    """Instantiate the task registered as ``name`` with those of ``kwargs`` that are
    its fields (``max_operand`` means nothing to an image task)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {sorted(TASKS)}")
    cls = TASKS[name]
    fields = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in kwargs.items() if k in fields})


__all__ = ["TASKS", "VISION_TASKS", "ArithTask", "CalcTask", "ShapesTask", "build_task"]
