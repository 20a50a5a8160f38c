"""``trainer.async_mode=fully_async`` through the real CLI on the micro model.

With ``async.max_staleness=0`` no group is admitted before the batch in front of
it has been trained: the same prompts, seeded the same way, sampled by the same
weights as ``sync``, so every step's metrics equal those of a ``sync`` run. With
the default bound of 1 the trainer takes one-update-old samples (staleness
measured per token), and a resumed run says how many buffered groups the
checkpoint did not keep.
"""

from __future__ import annotations

import pytest
from cli_utils import cli, cli_args, comparable, output, run, start

pytest.importorskip("vllm")

ASYNC = ("trainer.async_mode=fully_async",)


@pytest.fixture(scope="module")
def model(micro_model):
    return micro_model


def _shared(row: dict) -> dict:
    """What both modes report, without timings and the async-only counters."""
    return {
        k: v for k, v in comparable(row).items()
        if not k.startswith("async/")
    }  # fmt: skip


def test_max_staleness_zero_reproduces_sync(micro_model, straight_run, tmp_path):
    steps = 4
    sync = straight_run
    streamed = run(micro_model, tmp_path / "async", steps, *ASYNC, "async.max_staleness=0")
    assert [r["step"] for r in streamed] == list(range(steps + 1))
    for a, b in zip(sync, streamed, strict=True):
        assert _shared(a) == _shared(b), a["step"]
    trained = [r for r in streamed if r["step"] > 0]
    assert all(r["async/staleness_max"] == 0.0 and r["async/dropped_stale"] == 0 for r in trained)
    assert max(r.get("actor/grad_norm", 0.0) for r in sync) > 0  # the policy moved


def test_one_update_stale_samples_then_a_resume_that_says_what_it_dropped(model, tmp_path):
    run_dir = tmp_path / "b"
    rows = run(model, run_dir, 4, *ASYNC, "async.max_inflight=8")
    trained = [r for r in rows if r["step"] > 0]
    assert trained[0]["async/staleness_max"] == 0.0  # step 1: the initial weights
    # later steps: admitted one update ahead, never older than the bound
    assert all(r["async/staleness_max"] <= 1.0 for r in trained)
    assert max(r["async/staleness_mean"] for r in trained) > 0.0
    assert all(r["async/inflight_groups"] + r["async/buffer_groups"] <= 8 for r in trained)
    assert all(0.0 <= r["perf/rollout_idle_frac"] <= 1.0 for r in trained)

    # Resume from step 4's checkpoint for two more steps.
    proc = cli(cli_args(model, run_dir, 6, *ASYNC, "async.max_inflight=8"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stderr
    assert "resumed from" in text, text[-3000:]
    assert "were generating or buffered at the checkpoint" in text, text[-3000:]


def test_dynamic_sampling_and_lora_adapter_sync_stream_too(model, tmp_path):
    """DAPO's dynamic sampling drops groups whose rewards all agree and takes more
    from the stream; LoRA adapters reach the replica like weights (interrupting)."""
    rows = run(model, tmp_path / "dapo", 3, *ASYNC, "algo=dapo",
               "algo.dynamic_sampling.max_rounds=3")  # fmt: skip
    trained = [r for r in rows if r["step"] > 0]
    assert all(r["dapo/kept_groups"] >= 1 for r in trained)
    # every trained group has rewards that disagree: a nonzero advantage somewhere
    assert all(r["data/samples"] == 4 * r["dapo/kept_groups"] for r in trained)
    assert all(r["async/staleness_max"] <= 1.0 for r in trained)

    # (and async.max_inflight=auto steering the groups in flight)
    rows = run(model, tmp_path / "lora", 3, *ASYNC, "model.lora.rank=4",
               "rollout.lora_sync=adapter", "trainer.lr=2e-3", "async.max_inflight=auto")  # fmt: skip
    trained = [r for r in rows if r["step"] > 0]
    assert max(r["async/staleness_mean"] for r in trained) > 0.0
    assert max(r.get("actor/grad_norm", 0.0) for r in trained) > 0
    for r in trained:  # the engine's pressure, as the limit reads it
        assert 0.0 < r["rollout/kv_cache_usage_peak"] <= 1.0
        assert r["rollout/preemptions"] >= 0.0
        # starts at 2 x 4 groups, which staleness 1 also caps: only pressure trims it
        pressure = r["rollout/preemptions"] + r["async/dropped_stale"]
        assert (
            r["async/max_inflight"] == 8.0 if not pressure else 1.0 <= r["async/max_inflight"] < 8.0
        )


# A replica SIGKILLed mid-run is replaced in every run (test_faults_trainer.py, sync;
# test_faults_rollout.py, the rollout group's failover), and a signal's checkpoint
# mid-run is test_faults_driver.py's (SIGTERM) and test_board_browser.py's (SIGINT);
# the same with groups streaming, with -m extended.
@pytest.mark.extended
def test_a_killed_replica_is_replaced_and_a_sigint_checkpoints(model, tmp_path):
    """The faults of any mode, with groups streaming: a replica SIGKILLed mid-run
    is replaced and its groups' requests sent again (the run finishes every
    step); a SIGINT checkpoints the last finished step and exits 130."""
    import os
    import signal

    from cli_utils import actor_pids, metrics, wait_until

    run_dir = tmp_path / "run"
    proc = start(model, run_dir, 1000, *ASYNC, "trainer.save_every=0", session=True)
    try:
        wait_until(lambda: any(r["step"] == 1 for r in metrics(run_dir)), proc, run_dir)
        [pid] = actor_pids(proc.pid, "RolloutWorker")
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: metrics(run_dir)[-1].get("rollout/replica_restarts") == 1, proc, run_dir)
        killed_at = metrics(run_dir)[-1]["step"]
        wait_until(lambda: metrics(run_dir)[-1]["step"] >= killed_at + 2, proc, run_dir)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=180)
    finally:
        proc.kill()
    text = output(run_dir)
    assert code == 130, text[-3000:]
    assert "rollout replica 0 restarted and synced" in text
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(len(rows)))  # no step lost or repeated
    last = rows[-1]["step"]
    assert (run_dir / "checkpoints" / f"step_{last:06d}").is_dir(), text[-3000:]
    assert all(r["async/staleness_max"] <= 1.0 for r in rows[1:])
