"""Every algorithm preset runs on the built-in task and learns (real CLI, fixed seed)."""

from __future__ import annotations

import pytest

from tests.e2e.cli import run_cli

pytest.importorskip("vllm")

STEPS = 30
PRESETS = {
    "dapo": [],
    "ppo": [],
    "gspo": [],
    "gdpo": ["reward=arith_multi"],
    "rloo": [],
    "reinforce_pp": [],
    "dr_grpo": [],
    "cispo": [],
    "sapo": [],
    # Not presets, but the same promise: GRPO with LoRA, and with one-step-off rollout.
    "grpo_lora": ["model.lora.rank=8", "trainer.lr=2e-3"],
    "grpo_one_step_off": ["trainer.async_mode=one_step_off"],
    "grpo_pd": ["rollout=vllm_pd"],
}


@pytest.mark.slow
@pytest.mark.parametrize("algo", sorted(PRESETS))
def test_preset_learns(algo, tmp_path, model_cache):
    args = [
        # "grpo_lora" etc. are GRPO with extra switches
        f"algo={'grpo' if algo.startswith('grpo_') else algo}",
        *PRESETS[algo],
        f"trainer.total_steps={STEPS}",
        "trainer.val_every=0",
    ]
    history = run_cli(args, tmp_path / "run", model_cache)
    val = [h["val/accuracy"] for h in history if "val/accuracy" in h]
    assert len(val) == 2
    # Seed 0 starts at 0.33 held-out accuracy; each preset lifts it by at least 0.15.
    assert val[-1] - val[0] >= 0.15, val
    rewards = [h["reward/mean"] for h in history if "reward/mean" in h]
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5, rewards
    last = history[-1]
    if algo == "ppo":
        assert "critic/vf_loss" in last and "actor/reward_kl" in last
    if algo == "grpo_pd":
        assert "rollout/pd/kv_transfer_rate" in last
    if algo == "grpo_one_step_off":
        assert all(h["rollout/staleness"] == 1.0 for h in history[2:])
    if algo == "dapo":
        assert all("dapo/dropped_groups" in h for h in history[1:])
        assert all(h["dapo/kept_groups"] == 32 for h in history[1:])
