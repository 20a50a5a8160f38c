"""Which curves the run page draws, and the wall-time axis."""

from __future__ import annotations

from rlpost.board.charts import chart_data, group_metrics, x_values


def test_metrics_are_grouped_by_name():
    keys = [
        "reward/mean", "reward/correctness/mean", "reward/errors", "val/accuracy",
        "val/pass@4", "val/reward_errors", "actor/ppo_kl", "off_policy/kl_behav",
        "actor/entropy", "actor/pg_clipfrac", "rollout/logprob_abs_diff_max",
        "timing/generate_s", "timing/update_s", "timing/weight_sync_s", "timing/val_s",
        "perf/gen_tokens_per_s", "perf/rollout_idle_frac", "async/staleness_mean",
    ]  # fmt: skip
    charts = {title: mine for title, _, mine in group_metrics(keys)}
    assert charts["Reward"] == ["reward/mean", "reward/correctness/mean"]  # not reward/errors
    assert charts["Held-out"] == ["val/accuracy", "val/pass@4"]
    assert charts["KL"] == ["actor/ppo_kl", "off_policy/kl_behav"]
    assert charts["Entropy"] == ["actor/entropy"]
    assert charts["Clip fraction"] == ["actor/pg_clipfrac"]
    assert charts["Log-prob gap"] == ["rollout/logprob_abs_diff_max"]
    assert charts["Step time (s)"] == [
        "timing/generate_s",
        "timing/update_s",
        "timing/weight_sync_s",
    ]
    assert charts["Tokens/s"] == ["perf/gen_tokens_per_s"]
    assert charts["Async staleness"] == ["async/staleness_mean"]


def test_preference_and_sft_runs_get_their_pairs_losses_and_headline():
    # a DPO run, a reward model's and an SFT run: each has charts beyond time and speed
    keys = [
        "dpo/loss", "rewards/accuracies", "rewards/margins", "val/rewards/accuracies",
        "val/dpo/loss", "rm/accuracy", "rm/loss", "val/pair_accuracy", "val/reward_margin",
        "sft/nll", "val/nll", "timing/update_s",
    ]  # fmt: skip
    charts = {title: mine for title, _, mine in group_metrics(keys)}
    assert charts["Held-out"] == ["val/rewards/accuracies", "val/pair_accuracy", "val/nll"]
    assert charts["Pairs"] == [
        "rewards/accuracies", "rewards/margins", "rm/accuracy", "val/reward_margin"
    ]  # fmt: skip
    assert charts["Loss"] == ["dpo/loss", "val/dpo/loss", "rm/loss", "sft/nll"]


def test_wall_time_is_cumulative_step_time():
    rows = [{"step": 0}, {"step": 1, "timing/step_s": 1.5}, {"step": 2, "timing/step_s": 2.0}]
    assert x_values(rows, "step") == [0.0, 1.0, 2.0]
    assert x_values(rows, "time") == [0.0, 1.5, 3.5]  # 0, 0 + 1.5, 1.5 + 2.0


def test_series_hold_only_the_steps_that_logged_a_key_and_staleness_only_when_stale():
    a = [
        {"step": 0, "val/accuracy": 0.3},
        {"step": 1, "reward/mean": 0.2, "async/staleness_max": 0},
    ]
    b = [{"step": 1, "reward/mean": 0.5, "async/staleness_max": 1.0}]
    solo = chart_data([("a", a)])
    titles = [c["title"] for c in solo["charts"]]
    assert "Async staleness" not in titles  # never stale: nothing to show
    reward = next(c for c in solo["charts"] if c["title"] == "Reward")
    assert reward["series"] == [{"run": "a", "key": "reward/mean", "points": [[1.0, 0.2, 1]]}]
    both = chart_data([("a", a), ("b", b)])
    stale = next(c for c in both["charts"] if c["title"] == "Async staleness")
    assert [s["run"] for s in stale["series"]] == ["a", "b"]
