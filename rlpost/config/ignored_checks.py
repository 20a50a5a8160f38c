"""Config checks of keys that mean nothing in the run's mode: a key the run would not
read is refused, naming the key that does the job there, rather than ignored. Only a
value other than the schema's default is refused, so presets and defaults pass."""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING

from rlpost.config.groups import PREFERENCE_PRESETS, AgentConfig, RolloutConfig, TrainerConfig

if TYPE_CHECKING:
    from rlpost.config.groups import Config

# Keys that configure an agent program's episodes (agent.program), not the built-in loop's.
PROGRAM_ONLY = (
    "program_timeout_s",
    "max_concurrent_episodes",
    "train_segments",
    "endpoint_host",
    "endpoint_port",
)
# The keys that switch agent mode on; the others only shape its episodes.
AGENT_SWITCHES = ("tools", "env", "program")
# algo=sft trains on fixed rows and samples only to validate (greedy, or trainer.val_n
# samples at rollout.temperature / top_p).
SFT_ROLLOUT_ONLY = ("n", "min_tokens")
SFT_TRAINER_ONLY = ("async_mode",)
CRITIC_ONLY = ("critic_warmup", "critic_lr")


def _changed(obj: object, default: object, keys: tuple[str, ...]) -> list[tuple[str, object]]:
    return [(k, getattr(obj, k)) for k in keys if getattr(obj, k) != getattr(default, k)]


def ignored_key_checks(cfg: Config) -> list[str]:
    """Each key set to a value the run's mode would ignore, with what to set instead."""
    return agent_mode_checks(cfg) + sft_checks(cfg) + critic_checks(cfg) + curriculum_checks(cfg)


def curriculum_checks(cfg: Config) -> list[str]:
    """``data.curriculum`` samples the prompts of RL steps; its shaping keys need it on."""
    d, problems = cfg.data, []
    if d.curriculum != "none" and (cfg.algo.name in PREFERENCE_PRESETS or cfg.algo.name == "sft"):
        problems.append(
            f"data.curriculum={d.curriculum}: algo={cfg.algo.name} trains on fixed rows, which "
            "a curriculum does not choose among (it skips prompts the RL samples all agree "
            "on); drop data.curriculum"
        )
    if d.curriculum == "none":
        default = type(d)()
        for key, value in _changed(d, default, ("curriculum_window", "curriculum_return")):
            problems.append(
                f"data.{key}={value}: shapes the curriculum, which is off; set "
                "data.curriculum=pool (or gate), or drop the key"
            )
    return problems


def agent_mode_checks(cfg: Config) -> list[str]:
    """Single-turn keys under agent mode, agent keys without it, and agent-program keys
    under the built-in loop. The preference presets refuse every agent key themselves."""
    if cfg.algo.name in PREFERENCE_PRESETS:
        return []
    a, problems = cfg.agent, []
    if a.enabled and cfg.rollout.max_tokens != RolloutConfig().max_tokens:
        problems.append(
            f"rollout.max_tokens={cfg.rollout.max_tokens}: agent episodes do not read it (it "
            "limits single-turn completions); a model turn's limit is agent.max_turn_tokens "
            "(null: what agent.max_response_tokens leaves of the episode): set "
            f"agent.max_turn_tokens={cfg.rollout.max_tokens} instead, or drop rollout.max_tokens"
        )
    if not a.enabled:
        shaping = tuple(f.name for f in fields(AgentConfig) if f.name not in AGENT_SWITCHES)
        for key, value in _changed(a, AgentConfig(), shaping):
            problems.append(
                f"agent.{key}={value}: shapes multi-turn agent episodes, and this run has none "
                "(no agent.tools, agent.env or agent.program); set one of those, or drop the key"
            )
    elif a.program is None:
        for key, value in _changed(a, AgentConfig(), PROGRAM_ONLY):
            problems.append(
                f"agent.{key}={value}: configures agent.program's episodes; agent.tools and "
                "agent.env run the built-in loop, which does not read it; drop the key"
            )
    return problems


def sft_checks(cfg: Config) -> list[str]:
    """``algo=sft`` samples nothing during training (the preference presets' own checks
    do the same for them)."""
    if cfg.algo.name != "sft":
        return []
    changed = [
        *(("rollout", k, v) for k, v in _changed(cfg.rollout, RolloutConfig(), SFT_ROLLOUT_ONLY)),
        *(("trainer", k, v) for k, v in _changed(cfg.trainer, TrainerConfig(), SFT_TRAINER_ONLY)),
    ]
    return [
        f"{group}.{key}={value}: algo=sft trains on fixed rows and samples nothing during "
        "training, so it does not read the key; drop it"
        for group, key, value in changed
    ]


def critic_checks(cfg: Config) -> list[str]:
    """The critic's keys where there is no critic."""
    if cfg.algo.needs_critic:
        return []
    return [
        f"trainer.{key}={value}: only a critic reads it (algo.advantage.estimator=gae, as "
        f"algo=ppo); algo={cfg.algo.name} trains none; drop the key"
        for key, value in _changed(cfg.trainer, TrainerConfig(), CRITIC_ONLY)
    ]
