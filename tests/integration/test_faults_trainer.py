"""A trainer rank SIGKILLed in the middle of a CLI run: the driver closes and
rebuilds every trainer group, loads the last checkpoint (driver state too),
re-syncs the rollout and redoes the steps since. With a fixed seed in sync
mode every step's metrics equal those of a run that was never interrupted."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from cli_utils import comparable, metrics, output, run, start, trainer_pids, wait_until

from rlpost.tiny import build_tiny_model

pytest.importorskip("vllm")


def test_killed_trainer_rank_is_rebuilt_from_the_checkpoint(tmp_path):
    model = build_tiny_model("micro", tmp_path / "m", seed=0, init_std=0.3)
    steps = 6
    straight = run(model, tmp_path / "a", steps)

    run_dir = tmp_path / "b"
    proc = start(model, run_dir, steps)
    try:
        wait_until(lambda: any(r["step"] == 3 for r in metrics(run_dir)), proc, run_dir)
        [pid] = trainer_pids(proc.pid)  # trainer.world_size=1
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
    redo = re.search(r"redoing the steps after (\d+)", text)
    assert redo and int(redo.group(1)) in (2, 4)  # the checkpoint before the kill

    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(steps + 1))
    assert rows[-1]["trainer/restarts"] == 1
    for a, b in zip(straight, rows):
        assert comparable(a) == comparable(b), a["step"]
    assert max(r.get("actor/grad_norm", 0.0) for r in straight) > 0  # the policy moved
    print(f"trainer rank killed after step {last_done}: {last_done - int(redo.group(1))} "
          f"step(s) redone; the first redone step was logged {recovered_s:.1f}s after the kill")  # fmt: skip
