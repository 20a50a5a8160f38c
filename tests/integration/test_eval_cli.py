"""``python -m rlpost.eval`` on a model the real CLI trained: the metrics in
eval.json obey their definitions (pass@1 = c/n = mean@n for 0/1 scores, pass@k
grows with k), eval.md holds the table, a bad eval.k is a config error; and
``trainer.val_n`` logs the sampled validation metrics during training. One
training run (the built-in task's data on the micro model) serves every test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_utils import cli

from rlpost.models.tiny import build_tiny_model
from tests.cli_in_process import main_in_process

pytest.importorskip("vllm")

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "TQDM_DISABLE": "1"}
FAST = ["rollout.kv_cache_gib=0.0625", "data.val_size=16", "reward.num_workers=0"]
# The random model rarely adds up: a correctness with a spread in every group
# (completions of even length), so pass@k has something to grow on.
REWARD = (
    "def score(completion, row):\n"
    "    text = completion.split('<|', 1)[0]\n"
    "    return {'correctness': float(len(text) % 2 == 0), 'length': len(text) / 8.0}\n"
)


def _cli(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=600,
        cwd=ROOT, env=ENV,
    )  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two GRPO steps with trainer.val_n=4: the run folder (its final model in final/)."""
    tmp = tmp_path_factory.mktemp("eval-cli")
    model = build_tiny_model("micro", tmp / "m", seed=0)
    (tmp / "reward.py").write_text(REWARD)
    run = tmp / "run"
    proc = cli([
        f"model.path={model}", "reward=custom", f"reward.fn={tmp}/reward.py:score",
        "data.prompts_per_step=4", "rollout.n=4", "trainer.total_steps=2", "trainer.val_every=0",
        "trainer.save_every=0", "trainer.save_final=true", "trainer.val_n=4",
        "trainer.logger=[jsonl]", f"trainer.run_dir={run}", *FAST,
    ], cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run


def test_val_n_logs_sampled_validation_metrics(trained):
    rows = [json.loads(x) for x in (trained / "metrics.jsonl").read_text().splitlines()]
    validated = [r for r in rows if "val/accuracy" in r]
    assert [r["step"] for r in validated] == [0, 2]  # at the start and at the end
    for r in validated:
        # val/pass@k for k = 1, 2, 4; pass@1 is c/n: the mean of the 0/1 scores
        assert r["val/pass@1"] == pytest.approx(r["val/mean@n"])
        assert 0 <= r["val/pass@1"] <= r["val/pass@2"] <= r["val/pass@4"] <= 1
        assert 0 <= r["val/maj@4"] <= 1
        assert r["val/arith/mean@n"] == pytest.approx(r["val/mean@n"])  # one data source


def test_eval_writes_pass_at_k_for_the_trained_model(trained):
    reward = trained.parent / "reward.py"
    proc = main_in_process(
        [f"model.path={trained / 'final'}", "reward=custom", f"reward.fn={reward}:score",
         "eval.n=4", "eval.k=[1,2,4]", *FAST],
        cwd=ROOT, module="rlpost.eval",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = trained / "final" / "eval"  # the default: beside the model
    summary = json.loads((out / "eval.json").read_text())
    o = summary["overall"]
    assert summary["score"] == "correctness" and summary["k"] == [1, 2, 4]
    assert summary["counts"]["prompts"] == 16 and summary["counts"]["samples"] == 64
    assert summary["counts"]["greedy_samples"] == 16 and summary["counts"]["reward_errors"] == 0
    # unbiased pass@1 = c/n per prompt, the mean of its 0/1 scores: equal to mean@n
    assert o["pass@1"] == pytest.approx(o["mean@n"])
    assert 0 <= o["pass@1"] <= o["pass@2"] <= o["pass@4"] <= 1
    assert 0 < o["mean@n"] < 1 and o["pass@4"] > o["pass@1"]  # the reward has a spread
    assert all(0 <= o[m] <= 1 for m in ("greedy", "maj@1", "maj@2", "maj@4"))
    assert summary["per_source"]["arith"]["prompts"] == 16
    table = (out / "eval.md").read_text()
    header = (
        "| source | prompts | greedy | mean@4 | pass@1 | pass@2 | pass@4 | maj@1 | maj@2 | maj@4 |"
    )
    assert table.startswith(header) and "| overall | 16 |" in table and "| arith | 16 |" in table
    assert header in proc.stdout  # the table is printed too


@pytest.mark.parametrize(
    "args, message",
    [
        (["model.path=org/model", "eval.n=4", "eval.k=[8]"], "eval.k=[8]: each k must be between 1 and eval.n=4"),
        ([], "model.path: eval needs a trained model"),
    ],
)  # fmt: skip
def test_bad_eval_configs_exit_2_before_ray_starts(args, message):
    proc = _cli("rlpost.eval", *args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
    assert "Ray" not in proc.stderr  # refused before Ray started
