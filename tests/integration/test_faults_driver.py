"""The driver stopped from outside, through the real CLI on the micro model.

- SIGINT (Ctrl-C, sent to the whole process group; the reward workers are not
  in it, and ignore it) or SIGTERM, to the driver or to the whole process group
  (Ray's own processes keep SIGTERM blocked): it checkpoints the last finished step, stops
  its workers and its Ray, and exits 130 or 143 with a line saying how to
  resume. A second
  SIGINT stops it at once, mid-step, without a checkpoint; one during start-up
  (before the first step) exits 130 saying there is no checkpoint of this run.
- SIGKILL: nothing runs on the way out, yet its local Ray dies with it: the
  GCS and raylet share its fate (the kernel kills them), the workers follow
  their raylet. Ray's dashboard and runtime-env agents notice at once but spend
  up to a minute trying to report it to the dead GCS before they exit; the test
  ends them instead of waiting. The same command again (trainer.resume=auto)
  continues from the last checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import psutil
import pytest
from cli_utils import actor_pids, alive, descendants, metrics, output, start, wait_until

from rlpost.models.tiny import build_tiny_model

pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_tiny_model("micro", tmp_path_factory.mktemp("m"), seed=0, init_std=0.3)


def _ray_of(pid: int) -> dict:
    procs = descendants(pid)
    assert any("raylet" in cmdline for cmdline in procs.values()), "no local Ray under the driver"
    return procs


@pytest.mark.parametrize(
    "sig, group",
    [
        pytest.param(signal.SIGINT, True, marks=pytest.mark.extended),
        pytest.param(signal.SIGTERM, False, marks=pytest.mark.extended),
        (signal.SIGTERM, True),
    ],
    ids=["SIGINT", "SIGTERM", "SIGTERM-to-the-group"],
)
def test_signal_checkpoints_and_stops_cleanly(model, tmp_path, sig, group):
    run_dir = tmp_path / "run"
    # only the stop checkpoints; its own process group, as a terminal starts it
    proc = start(model, run_dir, 1000, "trainer.save_every=0", session=True)
    try:
        wait_until(lambda: len(metrics(run_dir)) >= 2, proc, run_dir)  # step 1 is done
        procs = _ray_of(proc.pid)
        sent = time.perf_counter()
        # Ctrl-C, `timeout`, batch schedulers and container runtimes signal the whole
        # process group, Ray's own processes included; `kill PID` the driver alone.
        if group:
            os.killpg(proc.pid, sig)
        else:
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
    to = "the process group" if group else "the driver"
    print(f"{sig.name} to {to}: stopped after step {last} with a checkpoint in {stop_s:.1f}s")


# The first signal's clean stop runs by default (above); the second's, with -m extended.
@pytest.mark.extended
def test_a_second_sigint_stops_at_once_without_a_checkpoint(model, tmp_path):
    # A reward that takes 0.2 s a call: a step of 16 calls on 2 reward workers
    # lasts ~1.6 s, time for both signals to land inside one step.
    slow = tmp_path / "slow_reward.py"
    slow.write_text(
        "import time\n\ndef score(completion, row):\n    time.sleep(0.2)\n"
        "    return len(completion) / 8.0\n"
    )
    run_dir = tmp_path / "run"
    extra = ("trainer.save_every=0", f"reward.fn={slow}:score", "data.val_size=4")
    proc = start(model, run_dir, 1000, *extra)
    try:
        wait_until(lambda: len(metrics(run_dir)) >= 2, proc, run_dir)  # step 1 is done
        procs = _ray_of(proc.pid)
        proc.send_signal(signal.SIGINT)
        wait_until(lambda: "stopping after the current step" in output(run_dir), proc, run_dir)
        sent = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
    finally:
        proc.kill()
    stop_s = time.perf_counter() - sent
    text = output(run_dir)
    assert code == 130, text[-3000:]
    assert "stopped at once by a second SIGINT: the step in progress was not checkpointed" in text
    assert "trainer.resume=auto" in text
    assert not (run_dir / "checkpoints").exists()  # the first SIGINT's checkpoint never came
    last = metrics(run_dir)[-1]["step"]
    # A worker killed mid-task (ray.kill is asynchronous) may take a moment to exit.
    at_exit = alive(procs, grace_s=0)
    assert alive(procs, grace_s=15) == []
    print(f"SIGINT twice during step {last + 1}: stopped {stop_s:.1f}s after the second, the "
          f"step unfinished and not checkpointed (a step takes ~1.6 s here); Ray processes "
          f"left at exit: {len(at_exit)}, all gone {time.perf_counter() - sent:.1f}s after "
          "the second SIGINT")  # fmt: skip


def test_a_signal_during_start_up_exits_130_saying_there_is_no_checkpoint(model, tmp_path):
    run_dir = tmp_path / "run"
    proc = start(model, run_dir, 1000)
    try:
        # A trainer rank exists: the handlers are in (they follow Ray's start) and
        # the rollout is still being built, so the step loop has not begun.
        wait_until(lambda: actor_pids(proc.pid, "TrainerWorker"), proc, run_dir)
        procs = _ray_of(proc.pid)
        sent = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
    finally:
        proc.kill()
    stop_s = time.perf_counter() - sent
    text = output(run_dir)
    assert code == 130, text[-3000:]
    assert "stopped by SIGINT during start-up, before the first step" in text, text[-3000:]
    assert "this run wrote no checkpoint to resume from" in text
    assert metrics(run_dir) == [] and not (run_dir / "checkpoints").exists()
    assert alive(procs, grace_s=0) == []
    print(f"SIGINT during start-up (trainer ranks starting): exit 130 {stop_s:.1f}s later, "
          "nothing trained, no checkpoint, no Ray process left")  # fmt: skip


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
