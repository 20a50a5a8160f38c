"""``trainer.save_best``: the policy is saved when its held-out headline beats every
earlier value (lower for NLL), and a resumed run keeps comparing with the best
kept on disk."""

from __future__ import annotations

import json
import math
from pathlib import Path

from rlpost.loop.best import BestPolicy


class Saves:
    """Stands in for the trainer group's ``save_hf``: records the calls, writes a file."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, directory: str) -> str:
        self.calls += 1
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / "config.json").write_text("{}")
        return directory


def test_the_best_accuracy_so_far_is_kept_and_a_resumed_run_compares_with_it(tmp_path):
    save = Saves()
    best = BestPolicy(tmp_path, save)
    history: list[dict] = []
    kept = []
    for step, acc in [(0, 0.30), (10, 0.50), (20, 0.40), (30, 0.50), (40, 0.60)]:
        metrics = {"val/accuracy": acc, "reward/mean": 0.1}
        kept.append(best.offer(step, metrics, history))
        history.append({"step": step, **metrics})
    # 0.30 first, 0.50 better, 0.40 worse, 0.50 a tie (not better), 0.60 better
    assert kept == [True, True, False, False, True] and save.calls == 3
    record = json.loads((tmp_path / "best" / "best.json").read_text())
    assert record == {"step": 40, "key": "val/accuracy", "value": 0.6}
    again = BestPolicy(tmp_path, save)  # a resumed run: the best on disk counts
    assert not again.offer(50, {"val/accuracy": 0.55}, history)
    assert again.offer(60, {"val/accuracy": 0.7}, history) and save.calls == 4


def test_nll_is_best_when_lowest_and_a_step_without_the_figure_saves_nothing(tmp_path):
    save = Saves()
    best = BestPolicy(tmp_path, save)
    history = [{"step": 1, "sft/nll": 3.0}]
    assert best.offer(2, {"val/nll": 2.5}, history)
    assert not best.offer(3, {"val/nll": 2.7}, history)
    assert best.offer(4, {"val/nll": 2.0}, history)
    assert not best.offer(5, {"sft/nll": 1.0}, history)  # no held-out figure this step
    assert not best.offer(6, {"val/nll": math.nan}, history)
    assert save.calls == 2
    assert json.loads((tmp_path / "best" / "best.json").read_text())["value"] == 2.0
