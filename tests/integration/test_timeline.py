"""The run timeline of a real CLI run (``straight_dir``: four sync steps, 4 prompts x
4 samples, validation and a checkpoint every 2 steps, trainer.trace at its default)."""

from __future__ import annotations

import json

import pytest

from rlpost.loop.trace_file import critical_path, lane_names, read_trace, step_spans

pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def trace(straight_dir):
    text = (straight_dir / "trace.json").read_text()
    assert text.rstrip().endswith("]")  # the run closed its trace
    events = json.loads(text)  # plain JSON, as the viewers read it
    assert events == read_trace(straight_dir / "trace.json")
    return events


def _end(e: dict) -> float:
    return e["ts"] + e["dur"]


def _lane(events, name: str) -> int:
    return next(pid for pid, lane in lane_names(events).items() if lane == name)


def test_every_process_has_a_lane_and_every_step_its_span(trace):
    assert set(lane_names(trace).values()) == {"controller", "policy rank 0", "rollout replica 0"}
    steps = [e for e in trace if e.get("name") == "step"]
    assert [e["args"]["step"] for e in steps] == [1, 2, 3, 4]
    for a, b in zip(steps, steps[1:]):
        assert _end(a) <= b["ts"]  # one after another


def test_the_named_steps_cover_the_step_and_nest(trace):
    controller = _lane(trace, "controller")
    for step in (1, 2, 3, 4):
        outer, spans = step_spans(trace, step)
        mine = [e for e in spans if e["pid"] == controller]
        # The controller is one thread: any two of its spans are apart or nested,
        # and all of them are inside the step.
        for e in mine:
            assert outer["ts"] <= e["ts"] and _end(e) <= _end(outer) + 1, e
        for a in mine:
            for b in mine:
                if a is not b and a["ts"] <= b["ts"] < _end(a):
                    assert _end(b) <= _end(a) + 1, (a["name"], b["name"])
        top = [e for e in critical_path(outer, spans) if e["pid"] == controller]
        names = [e["name"] for e in top]
        rl_step = ["take_rollouts", "batch", "release_rollout", "compute_logprobs",
                   "compute_advantages", "update", "tell_source", "step_figures"]  # fmt: skip
        end = ["validate", "trace", "log", "checkpoint"] if step % 2 == 0 else ["trace", "log"]
        assert names == rl_step + end
        covered = sum(e["dur"] for e in top)
        # what is not inside a named step: the loop's own bookkeeping between them
        assert covered >= 0.95 * outer["dur"], (covered, outer["dur"], names)


def test_requests_hold_the_step_tokens_and_their_segments(trace, straight_run):
    replica = _lane(trace, "rollout replica 0")
    controller = _lane(trace, "controller")
    outer, spans = step_spans(trace, 1)
    take = next(e for e in spans if e["name"] == "take_rollouts" and e["pid"] == controller)
    requests = [e for e in spans if e["pid"] == replica and e["name"] == "request"]
    assert len(requests) == 4  # one request of rollout.n=4 samples per prompt
    for r in requests:
        assert take["ts"] <= r["ts"] and _end(r) <= _end(take)
        assert r["args"]["version"] == 0
        segs = [
            e
            for e in spans
            if e["pid"] == replica and e["tid"] == r["tid"] and e["cat"] == "segment"
        ]
        segs = [e for e in segs if r["ts"] <= e["ts"] <= _end(r)]
        assert [e["name"] for e in segs] == ["queued", "prefill", "decode"]
        for a, b in zip(segs, segs[1:]):
            assert abs(_end(a) - b["ts"]) < 1.0  # end to end, in microseconds
    # the request spans carry the step's sampled tokens: length_mean x samples
    row = next(r for r in straight_run if r["step"] == 1)
    tokens = sum(r["args"]["tokens"] for r in requests)
    assert tokens == round(row["response/length_mean"] * row["data/samples"])
    # overlapping requests are drawn on rows of their own
    for a in requests:
        for b in requests:
            if a is not b and a["tid"] == b["tid"]:
                assert _end(a) <= b["ts"] or _end(b) <= a["ts"]


def test_the_update_runs_on_the_rank_inside_the_controllers_update(trace, straight_run):
    rank = _lane(trace, "policy rank 0")
    replica = _lane(trace, "rollout replica 0")
    controller = _lane(trace, "controller")
    outer, spans = step_spans(trace, 2)
    update = next(e for e in spans if e["name"] == "update" and e["pid"] == controller)
    calls = [
        e for e in spans if e["pid"] == rank and e["ts"] >= update["ts"] and _end(e) <= _end(update)
    ]
    assert [e["name"] for e in calls] == ["update_policy_single_pass"]
    path = critical_path(outer, spans)
    assert path[path.index(update) + 1] == calls[0]  # the controller waited for the rank
    # the new weights: pushed by the controller, loaded by the replica as version 2
    push = next(e for e in spans if e["name"] == "push_weights")
    load = next(e for e in spans if e["pid"] == replica and e["name"] == "load_weights")
    assert push["ts"] <= load["ts"] and _end(load) <= _end(push) + 1
    assert load["args"]["version"] == push["args"]["version"] == 2
    for row in straight_run[1:]:
        assert 0 < row["perf/trace_s"] < row["timing/step_s"]
        assert row["perf/trace_missed_drains"] == 0
