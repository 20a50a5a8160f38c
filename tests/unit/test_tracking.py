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


def test_every_kind_of_run_has_one_headline_its_line_plot_and_board_share(tmp_path):
    """DPO (its implicit-reward pair accuracy), a reward model (pair accuracy), SFT
    (NLL) and RL without validation: the figure the final line, curves.png and the
    board's headline column show, first to last."""
    from rlpost.board.runs import headline as board_headline
    from rlpost.loop.tracking import first_and_last, headline

    dpo = [
        {"step": 0, "val/rewards/accuracies": 0.0, "val/dpo/loss": 0.693},
        {"step": 1, "dpo/loss": 0.69, "rewards/accuracies": 0.5},
        {"step": 2, "dpo/loss": 0.6, "rewards/accuracies": 0.75, "val/rewards/accuracies": 0.625},
    ]
    assert headline(dpo).train == "rewards/accuracies"
    assert first_and_last(dpo) == ("val/rewards/accuracies", 0.0, 0.625)
    assert board_headline(dpo) == first_and_last(dpo)
    rm = [{"step": 1, "rm/accuracy": 0.6}, {"step": 2, "val/pair_accuracy": 0.9}]
    assert first_and_last(rm) == ("val/pair_accuracy", 0.9, 0.9)
    sft = [{"step": 0, "val/nll": 3.2}, {"step": 5, "sft/nll": 2.0, "val/nll": 1.5}]
    assert first_and_last(sft) == ("val/nll", 3.2, 1.5)
    # no validation: the training twin; RL's is reward/mean, not val/accuracy's
    assert first_and_last([{"step": 1, "reward/mean": 0.2}, {"step": 2, "reward/mean": 0.4}]) == (
        "reward/mean", 0.2, 0.4
    )  # fmt: skip
    assert first_and_last([{"step": 1, "rewards/accuracies": 0.5}]) == (
        "rewards/accuracies",
        0.5,
        0.5,
    )
    assert first_and_last([{"step": 1, "timing/step_s": 1.0}]) is None

    tracker = Tracker(tmp_path, [], total_steps=2, config={})
    for row in dpo:
        tracker.log(row["step"], {k: v for k, v in row.items() if k != "step"})
    tracker.plot()
    tracker.close()
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_the_dpo_curves_plot_draws_the_headline_and_its_training_twin(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    drawn: list[str] = []
    real = Axes.plot

    def plot(self, *args, label=None, **kw):  # type: ignore[no-untyped-def]
        drawn.append(label)
        return real(self, *args, label=label, **kw)

    monkeypatch.setattr(Axes, "plot", plot)
    tracker = Tracker(tmp_path, [], total_steps=2, config={})
    tracker.log(1, {"dpo/loss": 0.69, "rewards/accuracies": 0.5})
    tracker.log(2, {"rewards/accuracies": 0.75, "val/rewards/accuracies": 0.625})
    tracker.plot()
    tracker.close()
    assert drawn == ["rewards/accuracies", "val/rewards/accuracies"]
