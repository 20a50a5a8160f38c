"""Exact resume through the real CLI: 2k steps in one run equal k steps, a stop,
and k more steps resumed from the checkpoint (fixed seed)."""

from __future__ import annotations

import pytest
from cli_utils import comparable, run

from rlpost.loop.trace_file import read_trace
from rlpost.models.tiny import build_tiny_model

pytest.importorskip("vllm")


# A run resumed from its checkpoint of step 2 redoes steps 3 and 4 exactly in every
# run (test_checkpoint.py's truncated newest checkpoint); this finished-then-extended
# path with -m extended.
@pytest.mark.extended
def test_resumed_run_matches_uninterrupted_run(micro_model, straight_run, tmp_path):
    straight = straight_run
    run(micro_model, tmp_path / "b", 2)
    resumed = run(micro_model, tmp_path / "b", 4)
    assert [r["step"] for r in resumed] == [0, 1, 2, 3, 4]
    assert sorted(p.name for p in (tmp_path / "b" / "checkpoints").iterdir()) == [
        "step_000002",
        "step_000004",
    ]
    for a, b in zip(straight, resumed):
        assert comparable(a) == comparable(b), a["step"]
    # The policy really moved between steps 2 and 4 (the comparison is not vacuous).
    assert max(r.get("actor/grad_norm", 0.0) for r in straight) > 0
    # The resumed run's timeline holds each step once: steps 3 and 4 of the first run
    # (none: it stopped at 2) are not doubled, steps 1 and 2 are kept.
    steps = [
        e["args"]["step"] for e in read_trace(tmp_path / "b" / "trace.json") if e["name"] == "step"
    ]
    assert steps == [1, 2, 3, 4]


# A run stopped by SIGTERM mid-run checkpoints and resumes in every run
# (test_faults_driver.py, test_faults_trainer.py, test_fully_async_cli.py's resume),
# and one-step-off trains in every run (tests/e2e/test_presets_learn.py's cispo);
# one-step-off's batch kept in its checkpoint, resumed exactly, with -m extended.
@pytest.mark.extended
def test_a_one_step_off_run_stopped_mid_run_resumes_exactly(tmp_path):
    # one_step_off trains step k+1 on a batch sampled before step k's update: the
    # checkpoint of step k keeps that batch, so the resumed run trains on it too.
    import signal

    from cli_utils import metrics, output, start, wait_until

    model = build_tiny_model("micro", tmp_path / "m", seed=0, init_std=0.3)
    mode = "trainer.async_mode=one_step_off"
    straight = run(model, tmp_path / "a", 6, mode)
    run_dir = tmp_path / "b"
    proc = start(model, run_dir, 6, mode)
    try:
        wait_until(lambda: any(r["step"] == 3 for r in metrics(run_dir)), proc, run_dir)
        proc.send_signal(signal.SIGTERM)  # checkpoints the step in progress (3 or 4)
        assert proc.wait(timeout=120) == 143, output(run_dir)[-3000:]
    finally:
        proc.kill()
    stopped = metrics(run_dir)[-1]["step"]
    assert 3 <= stopped < 6
    resumed = run(model, run_dir, 6, mode)
    assert [r["step"] for r in resumed] == list(range(7))
    for a, b in zip(straight, resumed):
        assert comparable(a) == comparable(b), a["step"]
    assert max(r.get("actor/grad_norm", 0.0) for r in straight[stopped + 1 :]) > 0
