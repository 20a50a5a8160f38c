"""A rollout that does not sample from the policy being trained stops the run.

On the CPU in float32 the rollout's and the trainer's log-probs of a sampled
token agree to ~1e-6, so a threshold below that must trip at step 1, and the
default one (1e-2) must not."""

from __future__ import annotations

import subprocess

from cli_utils import ENV, cli_command, metrics

from rlpost.tiny import build_tiny_model


def test_a_gap_above_the_threshold_stops_the_run_and_names_the_key(tmp_path):
    model = build_tiny_model("micro", tmp_path / "m", seed=0)
    run_dir = tmp_path / "run"
    cmd = cli_command(model, run_dir, 2, "rollout.max_logprob_gap=1e-12", "trainer.val_every=0")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "step 1: the rollout's log-probs differ" in proc.stderr
    assert "rollout.max_logprob_gap=1e-12" in proc.stderr
    rows = [r for r in metrics(run_dir) if r["step"] > 0]
    assert [r["step"] for r in rows] == [1]  # logged, then stopped before step 2
    gap = rows[0]["rollout/logprob_abs_diff_max"]
    assert 1e-12 < gap < 1e-2, gap  # the default threshold would have let it pass
    # grpo, one epoch, one mini-batch: the gap comes from the update's own forward,
    # and no separate old-log-prob pass ran
    assert rows[0]["timing/logprob_s"] < 0.01
