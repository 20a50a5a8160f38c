"""Keys the run's mode would not read are config errors naming what to set instead,
all reported at once, and only when set to something other than the default."""

from __future__ import annotations

import pytest

from rlpost.config.compose import compose
from rlpost.config.schema import ConfigError


def _problems(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        compose(overrides)
    return info.value.problems


def test_rollout_max_tokens_in_agent_mode_names_the_turn_limit():
    (msg,) = _problems(["agent=calculator", "rollout.max_tokens=4"])
    assert msg.startswith("rollout.max_tokens=4: agent episodes do not read it")
    assert "agent.max_turn_tokens=4" in msg


def test_defaults_and_presets_pass():
    compose(["agent=calculator"])  # rollout.max_tokens at its default
    compose(["agent=calculator", "agent.max_turn_tokens=4"])
    compose(["algo=ppo", "trainer.critic_warmup=2", "trainer.critic_lr=3e-4"])
    compose(["algo=sft", "trainer.val_n=4"])  # sft's validation samples val_n


def test_agent_keys_without_agent_mode():
    (msg,) = _problems(["agent.max_turns=6"])
    assert msg.startswith("agent.max_turns=6: shapes multi-turn agent episodes")
    assert "agent.tools, agent.env or agent.program" in msg


def test_program_keys_under_the_built_in_loop():
    (msg,) = _problems(["agent.tools=[multiply]", "agent.max_concurrent_episodes=4"])
    assert msg.startswith("agent.max_concurrent_episodes=4: configures agent.program's episodes")


def test_sampling_keys_under_sft():
    problems = _problems(["algo=sft", "rollout.n=4", "trainer.async_mode=one_step_off"])
    assert [p.split(":")[0] for p in problems] == ["rollout.n=4", "trainer.async_mode=one_step_off"]
    assert all("algo=sft trains on fixed rows" in p for p in problems)


@pytest.mark.parametrize("algo", ["grpo", "dpo"])
def test_critic_keys_without_a_critic(algo):
    extra = ["data=arith_pref"] if algo == "dpo" else []
    problems = _problems([f"algo={algo}", *extra, "trainer.critic_warmup=2"])
    # one problem, not one from the preference checks as well
    assert problems == [
        "trainer.critic_warmup=2: only a critic reads it (algo.advantage.estimator=gae, as "
        f"algo=ppo); algo={algo} trains none; drop the key"
    ]


def test_every_ignored_key_is_reported_at_once():
    problems = _problems(
        ["agent=calculator", "rollout.max_tokens=4", "agent.program_timeout_s=5",
         "trainer.critic_lr=1e-3", "async.max_staleness=2"]
    )  # fmt: skip
    keys = sorted(p.split("=")[0] for p in problems)
    assert keys == [
        "agent.program_timeout_s", "async.* is set but trainer.async_mode", "rollout.max_tokens",
        "trainer.critic_lr",
    ]  # fmt: skip
