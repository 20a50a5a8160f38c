"""Spans, the trace file and the critical path, by hand (no Ray)."""

from __future__ import annotations

import json
import time

import pytest

from rlpost.loop.trace_file import TraceFile, critical_path, lane_names, read_trace, step_spans
from rlpost.runtime.spans import Recorder


def test_a_recorder_times_spans_at_its_level_and_drains():
    r = Recorder()
    with r.span("off"):
        pass
    assert r.drain() == []  # a fresh recorder is off
    r.configure("steps", "controller")
    with r.span("outer", step=3) as extra:
        with r.span("micro", level="full"):
            pass
        time.sleep(0.01)
        extra["tokens"] = 7
    r.add("req", 10.0, 10.5, cat="rollout", row=2, version=1)
    outer, req = r.drain()
    assert outer["name"] == "outer" and outer["pid"] == "controller" and outer["ph"] == "X"
    assert outer["args"] == {"step": 3, "tokens": 7}
    assert outer["dur"] >= 10_000  # microseconds
    # 10.0 s -> 1e7 us, half a second -> 5e5 us
    assert (req["ts"], req["dur"], req["tid"], req["args"]) == (1e7, 5e5, 2, {"version": 1})
    assert r.drain() == []
    r.configure("full", "rank")
    with r.span("micro", level="full"):
        pass
    assert [e["name"] for e in r.drain()] == ["micro"]
    with pytest.raises(ValueError, match="off, steps, full"):
        r.configure("all", "x")


def test_overlapping_spans_take_free_rows():
    r = Recorder()
    a, b = r.take_row(), r.take_row()
    assert (a, b) == (1, 2)
    r.free_row(a)
    assert r.take_row() == 1  # the lowest free row again
    assert r.take_row() == 3


def _x(name, ts, dur, pid, cat="step", **args):  # times in microseconds
    e = {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": pid, "tid": 0}
    if args:
        e["args"] = args
    return e


def test_the_trace_file_names_lanes_reads_unterminated_and_resumes(tmp_path):
    path = tmp_path / "trace.json"
    t = TraceFile(path)
    t.write([_x("step", 0, 100, "controller", step=1), _x("request", 10, 50, "replica", "rollout")])
    t.write(
        [_x("step", 100, 100, "controller", step=2), _x("step", 200, 100, "controller", step=3)]
    )
    # before close: the array is unterminated, as after a killed run
    assert not path.read_text().rstrip().endswith("]")
    events = read_trace(path)
    assert lane_names(events) == {1: "controller", 2: "replica"}
    assert [e["pid"] for e in events if e["ph"] == "X"] == [1, 2, 1, 1]
    t.close()
    assert json.loads(path.read_text()) == events
    # resumed after step 2: step 3 is dropped (it runs again), the lanes are kept
    t = TraceFile.resume(path, 2)
    t.write([_x("step", 400, 100, "controller", step=3), _x("load", 410, 5, "trainer")])
    t.close()
    events = json.loads(path.read_text())
    steps = [(e["args"]["step"], e["ts"]) for e in events if e["name"] == "step"]
    assert steps == [(1, 0), (2, 100), (3, 400)]
    assert lane_names(events) == {1: "controller", 2: "replica", 3: "trainer"}


def test_the_critical_path_is_the_named_steps_and_what_each_waited_for():
    events = [
        _x("step", 0, 1000000, 1, step=1),
        _x("take_rollouts", 0, 600000, 1),
        _x("score", 550000, 40000, 1, "reward"),  # nested: not a named step of its own
        _x("request", 10000, 300000, 2, "rollout"),
        _x("request", 20000, 520000, 2, "rollout"),  # ends at 540 ms: the last the take waited for
        _x("decode", 100000, 440000, 2, "segment"),  # a segment is part of its request
        _x("update", 600000, 390000, 1),
        _x("update_policy", 605000, 380000, 3, "trainer"),
        _x("load_weights", 2000000, 10000, 2, "sync"),  # after the step: outside it
    ]
    outer, spans = step_spans(events, 1)
    assert outer is events[0] and events[-1] not in spans
    path = critical_path(outer, spans)
    assert [(e["name"], e["ts"]) for e in path] == [
        ("take_rollouts", 0), ("request", 20e3), ("update", 600e3), ("update_policy", 605e3),
    ]  # fmt: skip
    assert step_spans(events, 9) == (None, [])


def test_the_board_draws_a_step_with_its_critical_path(tmp_path):
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from rlpost.board.server import Board, make_app

    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    t = TraceFile(run / "trace.json")  # left unterminated: a run still going
    t.write([
        _x("step", 0, 1_000_000, "controller", step=1),
        _x("take_rollouts", 0, 600_000, "controller"),
        _x("request", 10_000, 500_000, "rollout replica 0", "rollout", version=0),
        _x("update", 600_000, 390_000, "controller"),
        _x("update_policy", 605_000, 380_000, "policy rank 0", "trainer"),
        _x("step", 1_000_000, 500_000, "controller", step=2),
    ])  # fmt: skip

    async def get(path: str) -> str:
        async with TestClient(TestServer(make_app(Board(root=tmp_path / "runs")))) as client:
            response = await client.get(path)
            assert response.status == 200
            return await response.text()

    page = asyncio.run(get("/timeline?run=r1&step=1"))
    assert "step <b>1</b> of 1&ndash;2: 1.000 s" in page
    # the step, its two named steps and the two spans they waited for
    assert page.count('<rect class="span"') == 5
    assert page.count('stroke="#000"') == 4  # all but the step itself are on the path
    # the path's table: update_policy starts 605 ms in and takes 38.0 % of the step
    assert (
        "<td>policy rank 0</td><td>update_policy</td><td>605.0</td><td>380.0</td><td>38.0 %</td>"
        in page
    )
    assert "step <b>2</b>" in asyncio.run(get("/timeline?run=r1"))  # the newest by default
    assert "timeline</a>" in asyncio.run(get("/run?run=r1"))
