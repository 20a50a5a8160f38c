"""``trace.json``: the run's spans as a Chrome trace (ui.perfetto.dev, chrome://tracing).

The file is the trace-event "JSON array" form, written as the run goes: ``[``,
then one event per line, each after a comma but the first; ``]`` when the run
ends. Both viewers open the array unterminated too, so a killed run's trace
is readable, and so is it here (``read_trace``). Each lane (a process: the
controller, a trainer rank, a replica) is a ``pid`` named by a metadata event.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlpost.runtime.spans import Event


def read_trace(path: Path) -> list[Event]:
    """The events of a trace file, closed or not."""
    text = path.read_text().strip()
    if not text:
        return []
    if not text.endswith("]"):
        text = text.rstrip(",") + "]"
    return json.loads(text)


class TraceFile:
    """Appends events to ``path``; ``resume_after(step)`` keeps what a resumed run keeps."""

    def __init__(self, path: Path):
        self.path = path
        self.lanes: dict[str, int] = {}
        self._count = 0
        self._file = open(path, "w")
        self._file.write("[\n")

    @classmethod
    def resume(cls, path: Path, step: int) -> TraceFile:
        """Reopen the trace of a run resumed after ``step``: the events up to that
        step's end are kept (the steps after it are run again)."""
        old = read_trace(path) if path.exists() else []
        ends = [
            e["ts"] + e["dur"]  # type: ignore[operator]
            for e in old
            if e.get("name") == "step" and _step_of(e) == step
        ]
        cut = max(ends) if ends else None
        trace = cls(path)
        trace.lanes = {name: pid for pid, name in lane_names(old).items()}
        for e in old:
            if e.get("ph") == "M":
                trace._write(e)
            elif cut is not None and float(e["ts"]) < cut:  # type: ignore[arg-type]
                trace._write(e)
        return trace

    def write(self, events: list[Event]) -> None:
        for e in events:
            lane = str(e["pid"])
            if lane not in self.lanes:
                self.lanes[lane] = len(self.lanes) + 1
                self._write({"name": "process_name", "ph": "M", "pid": self.lanes[lane],
                             "args": {"name": lane}})  # fmt: skip
                self._write({"name": "process_sort_index", "ph": "M", "pid": self.lanes[lane],
                             "args": {"sort_index": self.lanes[lane]}})  # fmt: skip
            self._write({**e, "pid": self.lanes[lane]})
        self._file.flush()

    def _write(self, event: Event) -> None:
        self._file.write(("," if self._count else "") + json.dumps(event) + "\n")
        self._count += 1

    def close(self) -> None:
        if not self._file.closed:
            self._file.write("]\n")
            self._file.close()


def _step_of(event: Event) -> int | None:
    args = event.get("args")
    return int(args["step"]) if isinstance(args, dict) and "step" in args else None


def lane_names(events: list[Event]) -> dict[int, str]:
    return {
        int(e["pid"]): str(e["args"]["name"])  # type: ignore[index,call-overload]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }


def step_spans(events: list[Event], step: int) -> tuple[Event | None, list[Event]]:
    """The ``step`` span of ``step`` and every span that overlaps it, by start."""
    outer = next((e for e in events if e.get("name") == "step" and _step_of(e) == step), None)
    if outer is None:
        return None, []
    start, end = float(outer["ts"]), float(outer["ts"]) + float(outer["dur"])  # type: ignore[arg-type]
    inside = [
        e
        for e in events
        if e.get("ph") == "X"
        and e is not outer
        and float(e["ts"]) < end  # type: ignore[arg-type]
        and float(e["ts"]) + float(e["dur"]) > start  # type: ignore[arg-type]
    ]
    return outer, sorted(inside, key=lambda e: float(e["ts"]))  # type: ignore[arg-type]


def critical_path(outer: Event, spans: list[Event]) -> list[Event]:
    """What the step waited on: the controller's named steps, in order, and in each
    the worker span that ended last within it (the request or rank it waited for).

    The controller is the step's own lane; a named step is a span of that lane
    directly inside the step. A worker span counts for the named step it ends in.
    """
    lane, eps = outer["pid"], 1e3  # 1 ms of slack for a reply's trip back
    named: list[Event] = []  # the step's direct children on the controller's lane
    for e in spans:
        if e["pid"] == lane and e.get("cat") == "step":
            if not named or float(e["ts"]) >= _end(named[-1]):  # type: ignore[arg-type]
                named.append(e)
    path: list[Event] = []
    for n in named:
        start, end = float(n["ts"]), float(n["ts"]) + float(n["dur"])  # type: ignore[arg-type]
        inner = [
            e
            for e in spans
            if e["pid"] != lane
            and e.get("cat") != "segment"
            and start <= float(e["ts"]) + float(e["dur"]) <= end + eps  # type: ignore[arg-type]
        ]
        path.append(n)
        if inner:
            path.append(max(inner, key=lambda e: float(e["ts"]) + float(e["dur"])))  # type: ignore[arg-type]
    return path


def _end(event: Event) -> float:
    return float(event["ts"]) + float(event["dur"])  # type: ignore[arg-type]
