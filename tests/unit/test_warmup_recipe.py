"""The built-in model's warm-up trains with a fixed recipe, whatever the run that
builds the cache trains with, so one cache key always means one model."""

from __future__ import annotations

import dataclasses

from rlpost.config.compose import compose
from rlpost.config.groups import TrainerConfig
from rlpost.models.warmup import warmup_config, warmup_key
from rlpost.plan.engines import engine_config

PLAIN = ["trainer.device=cpu"]
# Settings of the RL run that must not reach the warm-up.
RUN_ONLY = [
    "model.lora.rank=8",
    "trainer.mixed_precision=bf16",
    "trainer.world_size=2",
    "trainer.async_mode=one_step_off",
    "trainer.weight_decay=0.1",
    "trainer.betas=[0.8,0.9]",
    "trainer.max_grad_norm=0.5",
    "trainer.micro_batch_size=8",
    "trainer.lr=3e-6",
    "model.freeze_vision=false",
    "model.gradient_checkpointing=true",
]


def test_run_settings_do_not_reach_the_warmup():
    plain, run = compose(PLAIN), compose(PLAIN + RUN_ONLY)
    # the trainer and the model are all the warm-up reads besides the data
    for part in ("trainer", "model", "data"):
        assert getattr(warmup_config(run), part) == getattr(warmup_config(plain), part), part
    assert warmup_key(run) == warmup_key(plain)
    # The same holds with the Megatron backend selected for the run.
    megatron = compose(PLAIN + ["trainer=megatron"])
    assert megatron.trainer.name == "megatron"
    assert warmup_config(megatron).trainer == warmup_config(plain).trainer


def test_the_warmup_recipe_is_one_float32_rank_with_full_fine_tuning():
    w = warmup_config(compose(PLAIN + RUN_ONLY))
    t = w.trainer
    assert (t.name, t.world_size, t.mixed_precision) == ("fsdp", 1, "none")
    assert (w.model.dtype, w.model.lora.rank, w.model.freeze_vision) == ("float32", 0, True)
    from rlpost.trainers.fsdp import FSDPEngineConfig

    settings = engine_config(FSDPEngineConfig, w, "/m", 1e-3, 0, True)
    assert settings.dtype == "float32"
    assert (settings.weight_decay, settings.betas, settings.max_grad_norm) == (
        0.0,
        (0.9, 0.99),
        1.0,
    )
    assert not w.model.lora.enabled


def test_what_the_warmup_keeps_from_the_run():
    run = compose(PLAIN + ["trainer.seed=7", "trainer.threads=1", "model.preset=micro"])
    w = warmup_config(run)
    assert (w.trainer.seed, w.trainer.threads, w.trainer.device) == (7, 1, "cpu")
    assert (w.model.preset, w.model.warmup) == ("micro", run.model.warmup)
    assert w.data == run.data and w.reward == run.reward
    # ... and those it keeps change the key.
    assert warmup_key(run) != warmup_key(dataclasses.replace(run, trainer=TrainerConfig()))
    faster = compose(PLAIN + ["model.warmup.lr=2e-3"])
    assert warmup_key(faster) != warmup_key(compose(PLAIN))
