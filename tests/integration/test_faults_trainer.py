"""Worker processes SIGKILLed in the middle of a CLI run. The rollout replica:
a new one starts, loads the current weights, and the step's requests wait for
it (the only replica). A trainer rank: the driver closes and rebuilds every
trainer group, loads the last checkpoint (driver state too), re-syncs the
rollout and redoes the steps since. With a fixed seed in sync mode every
step's metrics equal those of a run that was never interrupted."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from cli_utils import actor_pids, comparable, metrics, output, run, start, wait_until

from rlpost.tiny import build_tiny_model

pytest.importorskip("vllm")


def test_killed_replica_and_trainer_rank_recover_exactly(tmp_path):
    model = build_tiny_model("micro", tmp_path / "m", seed=0, init_std=0.3)
    steps = 6
    straight = run(model, tmp_path / "a", steps)

    run_dir = tmp_path / "b"
    proc = start(model, run_dir, steps)
    try:
        wait_until(lambda: any(r["step"] == 1 for r in metrics(run_dir)), proc, run_dir)
        [pid] = actor_pids(proc.pid, "RolloutWorker")  # rollout.replicas=1
        os.kill(pid, signal.SIGKILL)
        killed = time.perf_counter()
        wait_until(lambda: metrics(run_dir)[-1].get("rollout/replica_restarts") == 1, proc, run_dir)
        replica_s = time.perf_counter() - killed

        wait_until(lambda: any(r["step"] == 3 for r in metrics(run_dir)), proc, run_dir)
        [pid] = actor_pids(proc.pid, "TrainerWorker")  # trainer.world_size=1
        os.kill(pid, signal.SIGKILL)
        killed = time.perf_counter()
        last_done = metrics(run_dir)[-1]["step"]
        wait_until(lambda: metrics(run_dir)[-1].get("trainer/restarts") == 1, proc, run_dir)
        recovered_s = time.perf_counter() - killed
        assert proc.wait(timeout=300) == 0, output(run_dir)[-3000:]
    finally:
        proc.kill()
    text = output(run_dir)
    assert "a trainer rank died; restart 1 of 1" in text, text[-3000:]
    assert "rollout replica 0 restarted and synced" in text
    redo = re.search(r"redoing the steps after (\d+)", text)
    assert redo and int(redo.group(1)) in (2, 4)  # the checkpoint before the kill

    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(steps + 1))
    assert rows[-1]["trainer/restarts"] == 1 and rows[-1]["rollout/replica_restarts"] == 1
    for a, b in zip(straight, rows):
        assert comparable(a) == comparable(b), a["step"]
    assert max(r.get("actor/grad_norm", 0.0) for r in straight) > 0  # the policy moved
    print(f"rollout replica killed after step 1: back within a step, {replica_s:.1f}s after "
          "the kill (the step that waited for it was logged then)")  # fmt: skip
    print(f"trainer rank killed after step {last_done}: {last_done - int(redo.group(1))} "
          f"step(s) redone; the first redone step was logged {recovered_s:.1f}s after the kill")  # fmt: skip
