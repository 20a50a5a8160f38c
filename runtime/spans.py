"""Spans for the run timeline: what each process did, when, as Chrome trace events.

Every process of a run (the controller, each trainer rank, each rollout replica)
has one ``RECORDER``. Code marks its work with ``span("name")`` (a context
manager), ``@traced("name")`` or ``add(name, start, end)`` for work timed
elsewhere (a vLLM request's queue, prefill and decode). The controller drains
the recorders once a step (``rlpost.loop.timeline``) and appends the events to
the run's ``trace.json``.

An event is a Chrome "complete" event (``ph: "X"``) with wall-clock times in
microseconds, so spans of different processes on one machine line up; ``pid``
is the process's lane name until the trace file numbers it. Levels: ``off``
records nothing, ``steps`` the named steps, trainer calls, requests and weight
syncs, ``full`` adds each micro-batch's forward and backward and the optimizer.
Stdlib only: every floor may import it.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

LEVELS = ("off", "steps", "full")
Event = dict[str, object]
P = ParamSpec("P")
R = TypeVar("R")


class Recorder:
    """This process's spans since the last ``drain``."""

    def __init__(self) -> None:
        self.level = "off"
        self.lane = "process"
        self._events: list[Event] = []
        self._lock = threading.Lock()
        self._rows: set[int] = set()  # rows of the lane taken by open overlapping spans

    def configure(self, level: str, lane: str) -> None:
        if level not in LEVELS:
            raise ValueError(f"trace level {level!r}: use one of {', '.join(LEVELS)}")
        self.level, self.lane = level, lane

    def on(self, level: str = "steps") -> bool:
        """Whether spans of ``level`` are recorded."""
        return LEVELS.index(self.level) >= LEVELS.index(level)

    def add(
        self,
        name: str,
        start_s: float,
        end_s: float,
        cat: str = "step",
        row: int = 0,
        level: str = "steps",
        **args: object,
    ) -> None:
        """A span from ``start_s`` to ``end_s`` (``time.time()`` seconds) on ``row`` of
        this process's lane; ``args`` are shown with it (step, version, tokens)."""
        if not self.on(level):
            return
        event: Event = {
            "name": name,
            "cat": cat,
            "ph": "X",
            "ts": round(start_s * 1e6, 1),
            "dur": round(max(end_s - start_s, 0.0) * 1e6, 1),
            "pid": self.lane,
            "tid": row,
        }
        if args:
            event["args"] = args
        with self._lock:
            self._events.append(event)

    @contextmanager
    def span(
        self, name: str, cat: str = "step", level: str = "steps", **args: object
    ) -> Iterator[dict[str, object]]:
        """Time the block as one span; the yielded dict takes args known only at its end."""
        if not self.on(level):
            yield {}
            return
        start = time.time()
        extra: dict[str, object] = {}
        try:
            yield extra
        finally:
            self.add(name, start, time.time(), cat, 0, level, **{**args, **extra})

    def take_row(self) -> int:
        """A free row for a span that overlaps others of this lane (concurrent
        requests): Chrome draws overlapping spans of one row as if nested."""
        with self._lock:
            row = next(i for i in range(1, len(self._rows) + 2) if i not in self._rows)
            self._rows.add(row)
            return row

    def free_row(self, row: int) -> None:
        with self._lock:
            self._rows.discard(row)

    def drain(self) -> list[Event]:
        with self._lock:
            events, self._events = self._events, []
        return events


RECORDER = Recorder()
span = RECORDER.span
add = RECORDER.add


def traced(
    name: str, cat: str = "step", level: str = "steps"
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a function so that each call is a span named ``name``."""

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            if not RECORDER.on(level):
                return fn(*args, **kwargs)
            with RECORDER.span(name, cat, level):
                return fn(*args, **kwargs)

        return call

    return wrap
