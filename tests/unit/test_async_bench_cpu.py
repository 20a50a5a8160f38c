"""bench/async_bench.py's CPU accounting: the per-step marks taken from a real
process writing its metrics, the busy share and core-seconds per sample over
steps 2..N-1, and the bound they put on a mode's samples/s."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "async_bench.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("async_bench_under_test", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_seconds_are_the_machines_and_grow(bench):
    busy0, idle0, stolen0 = bench.cpu_seconds()
    sum(i * i for i in range(300_000))  # some work of this process
    busy1, idle1, stolen1 = bench.cpu_seconds()
    assert busy1 > busy0 and idle1 >= idle0 and stolen1 >= stolen0 >= 0


def test_marks_follow_each_step_line_of_a_real_process(bench, tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    writer = textwrap.dedent(f"""
        import json, time
        with open({str(metrics)!r}, "w") as f:
            for step in range(4):
                time.sleep(0.3)
                f.write(json.dumps({{"step": step}}))  # the line's end comes later:
                f.flush()  # a half-written line is not read as a step
                time.sleep(0.2)
                f.write("\\n")
                f.flush()
    """)
    proc = subprocess.Popen([sys.executable, "-c", writer])
    marks = bench.cpu_at_each_step(proc, metrics)
    assert proc.returncode == 0
    assert sorted(marks) == [0, 1, 2, 3]
    busy = [marks[s][0] + marks[s][1] for s in range(4)]
    # each mark is taken after the last: ~0.5 s of the machine's CPU time apart
    assert all(b > a for a, b in zip(busy, busy[1:]))


def test_busy_share_and_core_seconds_over_steps_2_to_n_minus_1(bench):
    rows = [{"step": 0}] + [{"step": s, "data/samples": 32.0} for s in range(1, 12)]
    # (busy, idle, stolen) seconds and {pid: (role, seconds)} at step 1's line and
    # at step 10's (steps = 11); pid 7 is a replica restarted after step 1
    first = {5: ("trainer", 40.0), 6: ("rollout", 20.0), 9: ("other", 3.0)}
    later = {5: ("trainer", 64.0), 7: ("rollout", 9.0), 9: ("other", 3.5)}
    marks = {
        1: bench.Mark(100.0, 50.0, 1.0, first),
        10: bench.Mark(138.0, 52.0, 1.5, later),
        11: bench.Mark(150.0, 60.0, 2.0, later),
    }
    out = bench.cpu_use(marks, rows, steps=11)
    # busy 38 s of 38 + 2 = 40 s: 0.95; stolen 0.5 of 40.5; steps 2..10 trained 9 x 32 = 288
    assert out["cpu_busy_frac"] == pytest.approx(0.95)
    assert out["cpu_stolen_frac"] == pytest.approx(0.5 / 40.5)
    assert out["core_s_per_sample"] == pytest.approx(38 / 288)
    # trainer 64 - 40 = 24 s; the new replica's 9 s; the rest 38 - 24 - 9 = 5 s
    assert out["trainer_core_s_per_sample"] == pytest.approx(24 / 288)
    assert out["rollout_core_s_per_sample"] == pytest.approx(9 / 288)
    assert out["other_core_s_per_sample"] == pytest.approx(5 / 288)
    assert bench.cpu_use({1: marks[1]}, rows, steps=11) == {}  # a run cut short


def test_processes_are_found_with_their_roles(bench):
    # processes titled as Ray titles its workers while they run a method
    titled = {
        role: subprocess.Popen(["bash", "-c", f"exec -a '{title}' sleep 30"])
        for title, role in (("ray::TrainerWorker.call", "trainer"),
                            ("ray::RolloutWorker.generate", "rollout"))
    }  # fmt: skip
    try:
        time.sleep(0.3)  # until each has exec'd
        seen = bench.process_seconds()
    finally:
        for proc in titled.values():
            proc.kill()
            proc.wait()
    assert {role: seen[p.pid][0] for role, p in titled.items()} == {
        "trainer": "trainer",
        "rollout": "rollout",
    }
    role, seconds = seen[os.getpid()]
    assert role == "other" and seconds > 0  # this process: not a Ray worker


def test_the_bound_on_a_mode_over_sync(bench):
    sync = {"cpu_busy_frac": 0.95, "core_s_per_sample": 0.209}
    other = {"cpu_busy_frac": 0.92, "core_s_per_sample": 0.178}
    # with every core busy: 0.209 / (0.178 x 0.95) = 1.2360
    assert bench.cpu_bound(sync, other) == pytest.approx(1.2360, abs=1e-4)
    # the same work a sample: only sync's idle share is left, 1 / 0.95 = 1.0526
    assert bench.cpu_bound(sync, {**other, "core_s_per_sample": 0.209}) == pytest.approx(
        1.0526, abs=1e-4
    )
    assert bench.cpu_bound(sync, {"core_s_per_sample": 0.2}) is None  # measured before
    sentence = bench.cpu_sentence(sync, other, "fully_async_s2")
    # 0.178 / 0.209 = 0.852x the work a sample; 0.92 / 0.95 = 0.968x the busy share;
    # 0.968 / 0.852 = 1.137x the samples/s
    assert "0.85x sync's work a sample at 0.97x its busy share, so 1.14x" in sentence
    assert "at most 1.24x sync" in sentence and "(trainer" not in sentence
    roles = {"trainer_core_s_per_sample": 0.12, "rollout_core_s_per_sample": 0.05,
             "other_core_s_per_sample": 0.008}  # fmt: skip
    sentence = bench.cpu_sentence(sync, {**other, **roles}, "fully_async_s2")
    assert "0.178 (trainer 0.120, replicas 0.050, the rest 0.008)" in sentence
