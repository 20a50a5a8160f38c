"""algo=dpo and algo=rm through the real CLI on the micro model, and their config
errors (exit code 2, before Ray starts)."""

from __future__ import annotations

import json
import math

import pytest
from cli_utils import cli, metrics

from rlpost.models.tiny import build_tiny_model
from rlpost.rewards.reward_model import SequenceRewardModel, check_reward_model
from tests.cli_in_process import Finished

pytest.importorskip("vllm")

SMALL = [
    "data.prompts_per_step=4", "data.val_size=16", "rollout.kv_cache_gib=0.0625",
    "trainer.save_every=0", "trainer.val_every=0", "trainer.lr=1e-3",
]  # fmt: skip


def _cli(*args: str) -> Finished:
    return cli(list(args))


def _pair(a: int, b: int, wrong: int) -> dict:
    return {
        "prompt": [{"role": "user", "content": f"{a}+{b}="}],
        "chosen": [{"role": "assistant", "content": str(a + b)}],
        "rejected": [{"role": "assistant", "content": str(wrong)}],
        "margin": 0.5,
    }


def test_dpo_on_sampled_arith_pairs(tmp_path):
    model = build_tiny_model("micro", tmp_path / "m", seed=0)
    run_dir = tmp_path / "dpo"
    proc = _cli(
        "algo=dpo", "data=arith_pref", f"model.path={model}", *SMALL,
        "trainer.total_steps=3", "algo.dpo.precompute_ref=true", f"trainer.run_dir={run_dir}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = metrics(run_dir)
    steps = [r for r in rows if "dpo/loss" in r]
    assert len(steps) == 3
    # step 1: the policy is the reference, so every implicit reward is 0 and the
    # loss is -log sigma(0) = ln 2, plus the preset's rpo_alpha (1) x the chosen NLL
    assert steps[0]["dpo/loss"] == pytest.approx(math.log(2) + steps[0]["rpo/nll_loss"], abs=1e-4)
    assert steps[0]["rpo/nll_loss"] > 0
    assert steps[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-4)
    for r in steps:
        assert 0.0 <= r["rewards/accuracies"] <= 1.0
        assert r["logps/chosen"] < 0 and r["logps/rejected"] < 0
        assert r["data/pairs"] >= 4
    # the update moved the policy off the reference on the trained pairs
    assert steps[-1]["rewards/margins"] != pytest.approx(0.0, abs=1e-6)
    assert "val/accuracy" in rows[-1] and 0.0 <= rows[-1]["val/rewards/accuracies"] <= 1.0


def test_rm_on_pair_files_saves_a_loadable_reward_model(tmp_path):
    model = build_tiny_model("micro", tmp_path / "m", seed=0)
    train, val = tmp_path / "train.jsonl", tmp_path / "val.jsonl"
    pairs = [_pair(a, b, a + b + 1) for a in range(6) for b in range(6)]
    pairs += [_pair(1, 1, 2), _pair(2, 2, 4)]  # the same completion twice: malformed
    train.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    val_pairs = [_pair(a, 9, a + 7) for a in range(8)]
    val.write_text("".join(json.dumps(p) + "\n" for p in val_pairs))
    run_dir = tmp_path / "rm"
    proc = _cli(
        "algo=rm", "data=files", f"data.train_files=[{train}]", f"data.val_files=[{val}]",
        f"model.path={model}", *SMALL, "trainer.total_steps=3", "algo.rm.center_rewards_coef=0.01",
        f"trainer.run_dir={run_dir}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = metrics(run_dir)
    steps = [r for r in rows if "rm/loss" in r]
    assert len(steps) == 3
    for r in steps:
        assert 0.0 <= r["rm/accuracy"] <= 1.0 and math.isfinite(r["rm/loss"])
        assert r["data/malformed_rows"] == 2  # the count the load warning names
    assert "val/pair_accuracy" in rows[0] and "val/pair_accuracy" in rows[-1]
    final = run_dir / "final"
    assert check_reward_model(str(final)) == []
    # the saved head scores the held-out pairs as the trainer's last validation did
    rm = SequenceRewardModel(str(final))
    chats = [[*p["prompt"], *p[side]] for p in val_pairs for side in ("chosen", "rejected")]
    scores = rm.score(chats)
    accuracy = sum(c > r for c, r in zip(scores[0::2], scores[1::2])) / len(val_pairs)
    assert accuracy == pytest.approx(rows[-1]["val/pair_accuracy"])
    margin = sum(c - r for c, r in zip(scores[0::2], scores[1::2])) / len(val_pairs)
    assert margin == pytest.approx(rows[-1]["val/reward_margin"], abs=1e-4)


def test_offline_config_errors_exit_2_before_ray(tmp_path):
    proc = _cli("algo=dpo", "data=arith_pref", "rollout.n=4", "trainer.async_mode=one_step_off")
    assert proc.returncode == 2
    assert "rollout.n=4" in proc.stderr and "trainer.async_mode=one_step_off" in proc.stderr
    assert "ray" not in proc.stderr.lower()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    proc = _cli(
        "algo=dpo", "data=files", f"data.train_files=[{prompts}]", f"data.val_files=[{prompts}]"
    )
    assert proc.returncode == 2
    assert "'chosen' and 'rejected'" in proc.stderr and "['answer', 'prompt']" in proc.stderr
    proc = _cli("algo=rm", "data=arith_pref", "trainer=megatron")
    assert proc.returncode == 2 and "trainer.name=megatron: algo=rm" in proc.stderr
