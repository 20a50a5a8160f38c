"""The real CLI trains PPO with a Megatron policy, reference and critic at
tensor parallel 2, on the built-in task, and the policy gets better (fixed seed).
One of the presets' runs (``-m presets``, 2.5 min): by default the Megatron engines
are checked against FSDP2 step by step (tests/integration/test_megatron_engine.py,
test_megatron_critic.py) and GRPO on Megatron runs through the CLI at expert
parallelism 2 (tests/integration/test_megatron_moe.py); PPO on Megatron through
the CLI, resumed exactly, is tests/integration/test_megatron_resume_cli.py (-m extended).

The base policy is the one every other e2e test starts from: the warm-up trains
with its own recipe (one float32 FSDP2 rank, ``rlpost.models.warmup.warmup_config``)
whatever trainer the run uses. On the Megatron trainer, whose float sums differ
in the last bits, the warm-up could stop at another probe and give another base
policy (seed 0: held-out 0.415 rather than 0.330)."""

from __future__ import annotations

import pytest

from tests.e2e.cli import run_cli

pytest.importorskip("vllm")
pytest.importorskip("megatron.core")

STEPS = 30


@pytest.mark.slow
@pytest.mark.presets
def test_ppo_with_megatron_tp2_policy_reference_and_critic_learns(tmp_path, model_cache):
    args = [
        "algo=ppo",
        "trainer=megatron",
        "trainer.megatron.tp=2",
        "trainer.world_size=2",
        f"trainer.total_steps={STEPS}",
        "trainer.val_every=0",
        "trainer.seed=0",
    ]
    history = run_cli(args, tmp_path / "run", model_cache)
    val = [h["val/accuracy"] for h in history if "val/accuracy" in h]
    # Seed 0: 0.33 -> 0.575 measured; the presets' bar (test_presets_learn.py)
    assert val[-1] - val[0] >= 0.15, val
    steps = [h for h in history if h["step"] > 0]
    assert len(steps) == STEPS
    rewards = [h["reward/mean"] for h in steps]
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5, rewards
    assert all("critic/vf_loss" in h and "actor/reward_kl" in h for h in steps)
    # The replica sampled from the weights gathered off both tensor-parallel shards.
    assert max(h["rollout/logprob_abs_diff_max"] for h in steps) < 1e-3
