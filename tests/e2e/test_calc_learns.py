"""The real CLI trains multi-turn agent RL on the built-in calc task, and the policy
gets better at using the multiply tool: calling it with the right operands and
copying its result into the final answer."""

from __future__ import annotations

import pytest

from tests.e2e.cli import run_cli

pytest.importorskip("vllm")

STEPS = 30


# A learning run, opt-in with the presets' (-m presets); agent episodes' mechanics
# through the CLI (tools, environments, programs, log-prob parity over the gaps)
# are tests/integration/test_agent_cli.py's, in every run.
@pytest.mark.slow
@pytest.mark.presets
def test_tool_use_accuracy_rises(tmp_path, model_cache):
    args = [
        "algo=grpo", "agent=calculator", f"trainer.total_steps={STEPS}", "trainer.val_every=0",
        "trainer.seed=0",
    ]  # fmt: skip
    history = run_cli(args, tmp_path / "run", model_cache)
    val = [(h["step"], h["val/accuracy"]) for h in history if "val/accuracy" in h]
    assert [s for s, _ in val] == [0, STEPS]
    start, end = val[0][1], val[-1][1]
    # Seed 0: the warm-up leaves the base policy calling the tool in the right format
    # but copying digits badly (about 0.25 held out); GRPO lifts it past 0.6.
    assert 0.1 <= start <= 0.5, val
    assert end - start >= 0.2, val
    steps = [h for h in history if h["step"] > 0]
    assert len(steps) == STEPS
    # every episode calls the tool (a step samples 16 prompts x 8 episodes)
    assert all(h["agent/tool_calls"] >= 0.9 * h["data/samples"] for h in steps)
    rewards = [h["reward/mean"] for h in steps]
    assert sum(rewards[-10:]) / 10 > sum(rewards[:10]) / 10 + 0.1
    # The replica sampled from the trainer's weights at every step. Over a step's
    # ~10k tokens the gap measured at most 3e-5 (mean 5e-8) from a shell, but up to
    # 8.8e-3 (mean 7e-6) in one CI run of the same seed, same samples, whose engine
    # generated 1.5x faster: float32 rounding with a long tail (the cause of the
    # larger rounding there is not pinned down). Weights one
    # update stale (trainer.async_mode=one_step_off, steps 2-4) give 0.5-0.8 (mean
    # 2e-3): both bounds still tell those apart.
    assert max(h["rollout/logprob_abs_diff_mean"] for h in steps) < 1e-4
    assert max(h["rollout/logprob_abs_diff_max"] for h in steps) < 5e-2
