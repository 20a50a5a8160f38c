"""Built-in tasks: prompt sets with a verifiable reward, chosen by name."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from rlpost.data.tasks.arith import ArithTask
from rlpost.data.tasks.calc import CalcTask
from rlpost.data.tasks.shapes import ShapesTask

BuiltinTask = ArithTask | CalcTask | ShapesTask
TASKS: dict[str, type[BuiltinTask]] = {"arith": ArithTask, "calc": CalcTask, "shapes": ShapesTask}
VISION_TASKS = ("shapes",)  # prompts with images: a vision-language model is needed
# Data presets built from a task's rows (its prompts, answers and held-out split).
TASK_OF_DATA = {"arith_pref": "arith"}


def task_name(data_name: str) -> str:
    """The built-in task ``data.name`` draws its rows from (itself, or its base task)."""
    return TASK_OF_DATA.get(data_name, data_name)


def task_correctness(data_name: str) -> Callable[[str, dict], float] | None:
    """The built-in task's ``correctness(completion, row)`` for ``data.name``, or None
    (user files, reasoning-gym, tasks without one)."""
    import importlib

    name = task_name(data_name)
    if name not in TASKS:
        return None
    module = importlib.import_module(f"rlpost.data.tasks.{name}")
    return getattr(module, "correctness", None)


def build_task(name: str, **kwargs: int) -> BuiltinTask:
    """Instantiate the task registered as ``name`` with those of ``kwargs`` that are
    its fields (``max_operand`` means nothing to an image task)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {sorted(TASKS)}")
    cls = TASKS[name]
    fields = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in kwargs.items() if k in fields})


__all__ = [
    "TASKS",
    "TASK_OF_DATA",
    "VISION_TASKS",
    "ArithTask",
    "BuiltinTask",
    "CalcTask",
    "ShapesTask",
    "build_task",
    "task_correctness",
    "task_name",
]
