"""The user's reward through the real CLI: the keyword style (the row's columns as
keyword arguments) and a function written for TRL's GRPOTrainer train on the
user's files, and a reward that fails on most calls of a step stops the run
with its first traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_utils import cli

from rlpost.models.tiny import build_tiny_model
from tests.cli_in_process import Finished

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reward-cli")
    model = build_tiny_model("micro", tmp / "m", seed=0)
    rows = [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(20)]
    (tmp / "mine.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp / "my_reward.py").write_text(
        "def score(completion, answer=None, **row):\n"
        "    return float(completion.strip() == answer) + 0.01 * len(row['prompt'])\n"
        "def typo(completion, **row):\n"
        "    return float(completion == row['solution'])\n"
        "def trl_style(prompts, completions, answer, **kwargs):\n"
        "    return [float(c.strip() == a) + 0.01 * len(p)\n"
        "            for p, c, a in zip(prompts, completions, answer, strict=True)]\n"
    )
    return tmp, model


def _cli(tmp: Path, model: Path, fn: str, run: str) -> Finished:
    args = [
        f"model.path={model}", "data=files", f"data.train_files={tmp / 'mine.jsonl'}",
        f"data.val_files={tmp / 'mine.jsonl'}", "reward=custom", f"reward.fn={tmp}/my_reward.py:{fn}",
        "data.prompts_per_step=4", "rollout.n=2", "data.val_size=4", "trainer.total_steps=2",
        "trainer.val_every=0", "rollout.kv_cache_gib=0.0625", "trainer.logger=[jsonl]",
        "trainer.save_final=false", f"trainer.run_dir={tmp / run}",
    ]  # fmt: skip
    return cli(args, cwd=ROOT)


@pytest.mark.parametrize("fn", [pytest.param("score", marks=pytest.mark.extended), "trl_style"])
def test_keyword_and_trl_style_rewards_train_on_user_files(setup, fn):
    tmp, model = setup
    proc = _cli(tmp, model, fn, fn)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp / fn / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    assert len(steps) == 2 and all(r["reward/errors"] == 0 for r in steps)
    # every call got its columns: at least 0.01 * len("0+0=") = 0.04 per sample
    assert all(r["reward/mean"] >= 0.04 for r in steps)


def test_a_reward_failing_on_every_call_stops_the_run(setup):
    tmp, model = setup
    proc = _cli(tmp, model, "typo", "typo")
    assert proc.returncode == 2
    err = proc.stderr
    assert "reward.fn typo:" in err and "more than reward.max_error_frac=0.5" in err
    assert "typo(completion: str, **columns)" in err and "KeyError: 'solution'" in err


def test_reasoning_gym_datasets_train_with_their_own_verifiers(setup):
    pytest.importorskip("reasoning_gym")
    tmp, model = setup
    run = tmp / "rg"
    args = [
        f"model.path={model}", "algo=grpo", "data=reasoning_gym",
        "data.reasoning_gym.datasets=[chain_sum,basic_arithmetic]", "data.reasoning_gym.size=40",
        "data.reasoning_gym.config={chain_sum: {max_terms: 3}}", "data.max_prompt_tokens=150",
        "data.prompts_per_step=4", "rollout.n=2", "data.val_size=4", "trainer.total_steps=2",
        "trainer.val_every=0", "rollout.kv_cache_gib=0.0625", "trainer.logger=[jsonl]",
        "trainer.save_final=false", f"trainer.run_dir={run}",
    ]  # fmt: skip
    proc = cli(args, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    assert len(steps) == 2 and all(r["reward/errors"] == 0 for r in steps)
    # the verifiers' named reward: held-out accuracy is reported (a random model: ~0)
    assert "val/accuracy" in rows[0] and 0.0 <= rows[0]["val/accuracy"] <= 1.0
    # chain_sum (up to 3 terms) and basic_arithmetic questions fit 150 tokens
    assert all(r["data/dropped_long_prompts"] == 0 for r in steps)
