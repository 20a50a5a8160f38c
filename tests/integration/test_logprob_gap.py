"""A rollout that does not sample from the policy being trained stops the run.

On the CPU in float32 the rollout's and the trainer's log-probs of a sampled
token agree to ~1e-6, so a threshold below that must trip at step 1, and the
default one (1e-2) must not. Under bf16 the mean gap is the check."""

from __future__ import annotations

import yaml
from cli_utils import cli, cli_args, metrics

from rlpost.models.tiny import build_tiny_model


def test_a_gap_above_the_threshold_stops_the_run_and_names_the_key(tmp_path):
    model = build_tiny_model("micro", tmp_path / "m", seed=0)
    run_dir = tmp_path / "run"
    proc = cli(cli_args(model, run_dir, 2, "rollout.max_logprob_gap=1e-12", "trainer.val_every=0"))
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


def test_bf16_trains_on_both_sides_and_the_mean_gap_check_holds(tmp_path):
    """``trainer.mixed_precision=bf16`` on the CPU: the rollout follows it into bf16
    (``rollout.dtype=auto``), single tokens then differ by far more than float32's
    1e-6, and the mean-gap check, the one that holds under bf16, lets the run through."""
    model = build_tiny_model("micro", tmp_path / "m", seed=0)
    run_dir = tmp_path / "run"
    proc = cli(cli_args(model, run_dir, 2, "trainer.mixed_precision=bf16", "trainer.val_every=0"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["rollout"]["dtype"] == "bfloat16"
    rows = [r for r in metrics(run_dir) if r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["rollout/logprob_abs_diff_max"] > 1e-3  # bf16 rounding, not float32's 1e-6
        assert r["rollout/logprob_abs_diff_mean"] < 5e-2  # the default mean limit
