"""Config checks of the offline preference presets (``algo=dpo``, ``algo=rm``): their
data, the keys that mean nothing without sampling, and the trainer settings that
would split a pair."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlpost.config.groups import PREFERENCE_PRESETS, AgentConfig, RolloutConfig, TrainerConfig

if TYPE_CHECKING:
    from rlpost.config.groups import Config

PREFERENCE_DATA = ("arith_pref", "files")

# Keys that configure sampling during training, which the offline presets do not do
# (the data=arith_pref pairs are sampled once, at rollout.temperature / top_p).
_ROLLOUT_ONLY = ("n", "min_tokens")
_TRAINER_ONLY = ("async_mode", "val_n")  # the critic keys: ignored_key_checks


def preference_checks(cfg: Config) -> list[str]:
    """What ``algo=dpo`` / ``algo=rm`` need of the data and the trainer, and the RL
    keys they would ignore (each a problem naming the key)."""
    from rlpost.algos import PREFERENCE_LOSSES

    a, name = cfg.algo, cfg.algo.name
    if name not in PREFERENCE_PRESETS:
        problems = []
        if cfg.data.name == "arith_pref":
            problems.append(
                f"data.name=arith_pref: preference pairs train algo=dpo or algo=rm, not "
                f"algo={name}; use data=arith for {name}"
            )
        return problems
    problems = []
    if cfg.data.name not in PREFERENCE_DATA:
        problems.append(
            f"data.name={cfg.data.name}: algo={name} trains on preference pairs; use "
            "data=arith_pref (the built-in task's pairs) or data=files with 'chosen' and "
            "'rejected' columns"
        )
    rollout_defaults, trainer_defaults = RolloutConfig(), TrainerConfig()
    for key in _ROLLOUT_ONLY:
        value = getattr(cfg.rollout, key)
        if value != getattr(rollout_defaults, key):
            problems.append(
                f"rollout.{key}={value}: algo={name} trains offline on preference pairs and "
                "samples nothing during training; drop the key"
            )
    for key in _TRAINER_ONLY:
        value = getattr(cfg.trainer, key)
        if value != getattr(trainer_defaults, key):
            problems.append(
                f"trainer.{key}={value}: algo={name} trains offline on preference pairs; "
                "drop the key"
            )
    if cfg.agent != AgentConfig():
        problems.append(f"agent.*: algo={name} trains on fixed pairs; drop the agent keys")
    t = cfg.trainer
    if t.micro_batch_tokens:
        problems.append(
            f"trainer.micro_batch_tokens={t.micro_batch_tokens}: a token budget could split a "
            f"pair over two micro-batches; algo={name} cuts by trainer.micro_batch_size"
        )
    if t.micro_batch_size % 2:
        problems.append(
            f"trainer.micro_batch_size={t.micro_batch_size}: algo={name} needs an even number "
            "(chosen and rejected of a pair in one micro-batch)"
        )
    if t.world_size and cfg.data.prompts_per_step % t.world_size:
        problems.append(
            f"data.prompts_per_step={cfg.data.prompts_per_step}: the pairs of a step must "
            f"split evenly over trainer.world_size={t.world_size}"
        )
    if name == "dpo":
        if a.dpo.loss not in PREFERENCE_LOSSES:
            problems.append(
                f"algo.dpo.loss={a.dpo.loss!r}: expected one of {', '.join(sorted(PREFERENCE_LOSSES))}"
            )
    if name == "dpo" and t.name == "megatron" and t.megatron.vpp > 1:
        # Interleaved stages pad every micro-batch with empty rows, which would enter
        # the pair losses' metrics as pairs of their own.
        problems.append(
            f"trainer.megatron.vpp={t.megatron.vpp}: algo=dpo runs without virtual pipeline "
            "stages; set trainer.megatron.vpp=1"
        )
    if name == "rm":
        if t.name == "megatron":
            problems.append(
                "trainer.name=megatron: algo=rm trains a sequence-classification head, which "
                "the FSDP2 trainer builds; use trainer=fsdp"
            )
        if cfg.model.lora.rank:
            problems.append(
                f"model.lora.rank={cfg.model.lora.rank}: algo=rm trains the whole reward model "
                "(backbone and head); set model.lora.rank=0"
            )
        if t.packing:
            problems.append("trainer.packing=true: algo=rm runs padded; drop the key")
    return problems
