"""Worker processes SIGKILLed in the middle of a CLI run.

The rollout replica: a new one starts, loads the current weights, and the
step's requests wait for it (the only replica). A trainer rank: the driver
closes and rebuilds every trainer group, loads the last checkpoint (driver
state too), re-syncs the rollout and redoes the steps since; with no
checkpoint yet it rewinds to the start. With a fixed seed in sync mode every
step's metrics equal those of a run that was never interrupted.

With two ranks the survivor's collective fails with the dead rank (or, with
NCCL, blocks): the driver ends the whole group at once rather than waiting on
a graceful close. A rank killed after ``trainer.max_restarts`` restarts ends
the run with an error naming that key."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from cli_utils import (
    actor_pids,
    comparable,
    metrics,
    output,
    run,
    start,
    trainer_rank_pids,
    wait_until,
)

from rlpost.models.tiny import build_tiny_model
from tests.cli_in_process import stop_ray

pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_tiny_model("micro", tmp_path_factory.mktemp("m"), seed=0, init_std=0.3)


def test_killed_replica_and_trainer_rank_recover_exactly(model, tmp_path):
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
    print(f"trainer rank killed (1 rank) after step {last_done}: back to the checkpoint of step "
          f"{redo.group(1)}, {last_done - int(redo.group(1))} finished step(s) redone; the first "
          f"redone step was logged {recovered_s:.1f}s after the kill")  # fmt: skip


TWO = ("trainer.world_size=2",)


# A rank and a replica killed and recovered exactly in every run (above); this
# rewind past a lost rank with -m extended.
@pytest.mark.extended
def test_two_ranks_one_killed_before_a_checkpoint_rewinds_then_restarts_run_out(model, tmp_path):
    straight = run(model, tmp_path / "a", 4, *TWO)
    assert max(r.get("actor/grad_norm", 0.0) for r in straight) > 0  # the policy moved

    run_dir = tmp_path / "b"
    # No checkpoint, and steps enough that the run is still going at each kill.
    proc = start(model, run_dir, 1000, *TWO, "trainer.save_every=0", "trainer.max_restarts=1")
    try:
        wait_until(lambda: any(r["step"] == 1 for r in metrics(run_dir)), proc, run_dir)
        _, rank1 = trainer_rank_pids(proc.pid)
        os.kill(rank1, signal.SIGKILL)
        killed = time.perf_counter()
        last_done = metrics(run_dir)[-1]["step"]
        wait_until(lambda: metrics(run_dir)[-1].get("trainer/restarts") == 1, proc, run_dir)
        recovered_s = time.perf_counter() - killed

        wait_until(lambda: metrics(run_dir)[-1]["step"] >= 3, proc, run_dir)
        _, rank1 = trainer_rank_pids(proc.pid)
        os.kill(rank1, signal.SIGKILL)  # the one restart is used up
        killed = time.perf_counter()
        code = proc.wait(timeout=120)
        exit_s = time.perf_counter() - killed
    finally:
        proc.kill()
    text = output(run_dir)
    assert "a trainer rank died; restart 1 of 1" in text, text[-3000:]
    assert "redoing the steps after 0" in text, text[-3000:]  # rewound to the start
    assert code == 1, text[-3000:]
    assert "error: a trainer rank died after trainer.max_restarts=1 restart(s)" in text, text[-900:]
    assert "The last checkpoint is none" in text

    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(len(rows))) and len(rows) >= 4
    assert all(r["trainer/restarts"] == 1 for r in rows[1:])  # every step was redone
    for a, b in zip(straight[:4], rows):  # steps 0..3 (step 2 validates in both, 4 is last)
        assert comparable(a) == comparable(b), a["step"]
    print(f"trainer rank 1 of 2 killed after step {last_done}, before any checkpoint: rewound "
          f"to step 0, {last_done} finished step(s) redone; the redone step 1 was logged "
          f"{recovered_s:.1f}s after the kill")  # fmt: skip
    print(f"rank 1 killed again after step {rows[-1]['step']} with trainer.max_restarts=1: "
          f"exit {code} {exit_s:.1f}s after the kill, the error naming the key")  # fmt: skip


def test_a_rank_death_is_raised_over_the_survivors_broken_collective():
    """When a rank is SIGKILLed its peer's collective fails too, and that error can
    reach the driver first; ``_gather`` raises the death, which a restart handles."""
    import ray

    from rlpost.workers.trainer_worker import _gather

    class Rank:
        def pid(self) -> int:
            return os.getpid()

        def collective(self, peer_alive: bool) -> None:
            if not peer_alive:  # what gloo raises when the peer's socket closes
                raise RuntimeError("Read error: Connection reset by peer")
            time.sleep(60)

    stop_ray()  # the Ray this module's in-process runs shared: this test starts its own
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        rank = ray.remote(num_cpus=0)(Rank)
        survivor, victim = rank.remote(), rank.remote()
        pid = ray.get(victim.pid.remote())
        refs = [survivor.collective.remote(False), victim.collective.remote(True)]
        ray.wait(refs[:1])  # the survivor's error is in before the kill
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(ray.exceptions.RayActorError) as info:
            _gather(refs)
        assert info.value.actor_id == victim._actor_id.hex()
    finally:
        ray.shutdown()
