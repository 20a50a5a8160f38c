"""The driver stopped from outside, through the real CLI on the micro model.

- SIGINT or SIGTERM: it checkpoints the last finished step, stops its workers
  and its Ray, and exits 130 or 143 with a line saying how to resume.
- SIGKILL: nothing runs on the way out, yet its local Ray dies with it: the
  GCS and raylet share its fate (the kernel kills them), the workers follow
  their raylet. Ray's dashboard and runtime-env agents notice at once but spend
  up to a minute trying to report it to the dead GCS before they exit; the test
  ends them instead of waiting. The same command again (trainer.resume=auto)
  continues from the last checkpoint.
"""

from __future__ import annotations

import contextlib
import signal
import time

import psutil
import pytest
from cli_utils import alive, descendants, metrics, output, start, wait_until

from rlpost.tiny import build_tiny_model

pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_tiny_model("micro", tmp_path_factory.mktemp("m"), seed=0, init_std=0.3)


def _ray_of(pid: int) -> dict:
    procs = descendants(pid)
    assert any("raylet" in cmdline for cmdline in procs.values()), "no local Ray under the driver"
    return procs


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_checkpoints_and_stops_cleanly(model, tmp_path, sig):
    run_dir = tmp_path / "run"
    proc = start(model, run_dir, 1000, "trainer.save_every=0")  # only the stop checkpoints
    try:
        wait_until(lambda: len(metrics(run_dir)) >= 2, proc, run_dir)  # step 1 is done
        procs = _ray_of(proc.pid)
        sent = time.perf_counter()
        proc.send_signal(sig)
        code = proc.wait(timeout=120)
    finally:
        proc.kill()
    stop_s = time.perf_counter() - sent
    text = output(run_dir)
    assert code == 128 + sig, text[-3000:]
    last = metrics(run_dir)[-1]["step"]
    assert f"stopped by {sig.name} after step {last}" in text, text[-3000:]
    assert f"resume with the same command and trainer.run_dir={run_dir.resolve()} " in text
    checkpoints = [p.name for p in (run_dir / "checkpoints").iterdir()]
    assert checkpoints == [f"step_{last:06d}"]
    assert (run_dir / "checkpoints" / checkpoints[0] / "COMPLETE").exists()
    assert alive(procs, grace_s=0) == []  # gone by the time the driver exited
    print(f"{sig.name}: stopped after step {last} with a checkpoint in {stop_s:.1f}s")


def test_killed_driver_leaves_no_ray_and_resumes(model, tmp_path):
    run_dir = tmp_path / "run"
    steps = 6
    proc = start(model, run_dir, steps)
    try:
        wait_until((run_dir / "checkpoints/step_000002/COMPLETE").exists, proc, run_dir)
        procs = _ray_of(proc.pid)
        proc.kill()
        proc.wait(timeout=30)
        leaked = alive({p: c for p, c in procs.items() if "Agent" not in c})
    finally:
        proc.kill()
    for p in procs:  # the agents (see above); anything else would be a leak, asserted next
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    assert leaked == [], f"the SIGKILLed driver's Ray outlived it: {leaked}"
    done = [r["step"] for r in metrics(run_dir)]
    assert max(done) < steps

    started = time.perf_counter()
    proc = start(model, run_dir, steps)
    try:
        wait_until(lambda: metrics(run_dir)[-1]["step"] == 3, proc, run_dir)
        back_s = time.perf_counter() - started
        procs = _ray_of(proc.pid)
        assert proc.wait(timeout=300) == 0, output(run_dir)[-3000:]
    finally:
        proc.kill()
    assert "resumed from" in output(run_dir) and "step_000002 (step 2)" in output(run_dir)
    assert [r["step"] for r in metrics(run_dir)] == list(range(steps + 1))
    assert alive(procs, grace_s=0) == []
    print(f"SIGKILL after step {max(done)}: {max(done) - 2} step(s) lost; the rerun logged "
          f"step 3 {back_s:.1f}s after it started")  # fmt: skip
