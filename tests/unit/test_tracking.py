"""The progress bar and the metrics log of a run directory."""

from __future__ import annotations

import io
import json
import warnings

from rlpost.loop.tracking import Tracker


def test_fresh_run_bar_starts_at_zero_without_warning(tmp_path):
    tracker = Tracker(tmp_path, ["jsonl"], total_steps=5, config={})
    tracker.bar.fp = io.StringIO()  # keep the test's output clean
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a TqdmWarning (negative position) fails the test
        tracker.truncate(-1)  # what a run without a checkpoint does first
        assert tracker.bar.n == 0
        tracker.log(0, {"val/accuracy": 0.5})
        tracker.log(1, {"reward/mean": 0.25})
    assert tracker.bar.n == 1
    tracker.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]


def test_resume_truncates_later_rows(tmp_path):
    tracker = Tracker(tmp_path, ["jsonl"], total_steps=5, config={})
    tracker.bar.fp = io.StringIO()
    for step in range(4):
        tracker.log(step, {"reward/mean": float(step)})
    tracker.truncate(2)  # resumed from the checkpoint of step 2: steps 3.. are redone
    assert tracker.bar.n == 2
    tracker.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]


def test_the_held_out_headline_is_accuracy_only_with_a_correctness_signal(tmp_path, capsys):
    from rlpost.loop.tracking import val_headline

    assert val_headline([{"val/reward_mean": 0.3}]) == ("val/reward_mean", "val_reward")
    assert val_headline([{"val/reward_mean": 0.3, "val/accuracy": 0.2}]) == (
        "val/accuracy",
        "val_acc",
    )
    tracker = Tracker(tmp_path, ["console"], total_steps=2, config={})
    tracker.bar.fp = io.StringIO()
    tracker.log(0, {"val/reward_mean": 0.27})
    assert tracker.bar.postfix == "val_reward=0.270"
    tracker.close()
    assert "step 0: val/reward_mean=0.270" in capsys.readouterr().out
