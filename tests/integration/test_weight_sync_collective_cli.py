"""``rollout.weight_sync=collective`` and ``ipc`` through the real CLI: the policy's
weights reach the replica in buckets over a process group of their own, or as
shared memory the colocated replica maps, and the run is the one the object store
gives, metric for metric (fixed seed, sync mode), with the replica sampling from
the trained weights. A replica SIGKILLed mid-run is
restarted, catches up, and the weight group is made again with it."""

from __future__ import annotations

import os
import signal

import pytest
from cli_utils import actor_pids, comparable, metrics, output, run, start, wait_until

from rlpost.runtime.weight_wire import shm_dir

pytest.importorskip("vllm")

# 0.1 MiB buckets: the micro model's 0.33 MiB go in several
COLLECTIVE = ("rollout.weight_sync=collective", "rollout.weight_sync_bucket_mb=0.1")
STEPS = 4


def without_sync_figures(row: dict) -> dict:
    return {k: v for k, v in comparable(row).items() if not k.startswith("rollout/weight_sync/")}


@pytest.fixture(scope="module")
def model(micro_model):
    return micro_model


@pytest.fixture(scope="module")
def store(straight_run):
    """The run both transfers must reproduce: weights through the object store."""
    return straight_run


def test_collective_sync_equals_the_object_store_run(model, store, tmp_path):
    collective = run(model, tmp_path / "collective", STEPS, *COLLECTIVE)
    assert [without_sync_figures(r) for r in collective] == [without_sync_figures(r) for r in store]
    trained = [r for r in collective if r["step"] > 0]
    # several buckets, one held at a time (no tensor of the micro model is over 0.1 MiB)
    assert all(r["rollout/weight_sync/buckets"] >= 3 for r in trained)
    assert all(0 < r["rollout/weight_sync/peak_bucket_mb"] <= 0.1 for r in trained)
    assert all(r["rollout/weight_sync/mb"] == pytest.approx(0.334, abs=0.01) for r in trained)
    assert all(r["rollout/weight_sync/rebuilds"] == 0 for r in trained)
    assert max(r["rollout/logprob_abs_diff_max"] for r in trained) < 1e-3
    assert "rollout/weight_sync/buckets" not in store[-1]


def test_ipc_hand_off_equals_the_object_store_run(model, store, tmp_path):
    # On the CPU each bucket is a shared-memory file the replica maps; on a GPU a
    # CUDA-IPC handle (tests/integration/test_gpu_check.py runs that hand-off).
    ipc = run(model, tmp_path / "ipc", STEPS, "rollout.weight_sync=ipc",
              "rollout.weight_sync_bucket_mb=0.1")  # fmt: skip
    assert [without_sync_figures(r) for r in ipc] == [without_sync_figures(r) for r in store]
    trained = [r for r in ipc if r["step"] > 0]
    assert all(r["rollout/weight_sync/buckets"] >= 3 for r in trained)
    # the trainer keeps only the bucket it packed last
    assert all(0 < r["rollout/weight_sync/peak_bucket_mb"] <= 0.1 for r in trained)
    assert all(r["rollout/weight_sync/mb"] == pytest.approx(0.334, abs=0.01) for r in trained)
    assert max(r["rollout/logprob_abs_diff_max"] for r in trained) < 1e-3
    leftover = [p for p in os.listdir(shm_dir()) if p.startswith("rlpost-weights-")]
    assert not leftover, leftover  # every bucket's file was removed


# A killed replica fails over, restarts and resyncs in every run
# (tests/integration/test_faults_rollout.py); rejoining a remade collective group,
# with -m extended.
@pytest.mark.extended
def test_a_killed_replica_rejoins_a_remade_weight_group(model, tmp_path):
    run_dir = tmp_path / "run"
    proc = start(model, run_dir, STEPS + 2, *COLLECTIVE)
    try:
        wait_until(lambda: any(r["step"] == 2 for r in metrics(run_dir)), proc, run_dir)
        [pid] = actor_pids(proc.pid, "RolloutWorker")
        os.kill(pid, signal.SIGKILL)
        assert proc.wait(timeout=300) == 0, output(run_dir)[-3000:]
    finally:
        proc.kill()
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(STEPS + 3))
    last = rows[-1]
    assert last["rollout/replica_restarts"] == 1
    assert last["rollout/weight_sync/rebuilds"] >= 1  # the new replica joined a new group
    assert max(r["rollout/logprob_abs_diff_max"] for r in rows[3:]) < 1e-3
