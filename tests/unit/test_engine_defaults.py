"""Defaults live once, in the run config's schema: an engine config that
rlpost/plan/engines.py builds from the default run holds, for every field, either
the value the engine config would default to or a value of a field that has no
default there (the learning rate, its warm-up, the KV-cache size). A default of
an engine's own that disagrees with the run's would be a second source."""

from __future__ import annotations

import dataclasses

import pytest

from rlpost.config import compose
from rlpost.device import resolve_device
from rlpost.plan.engines import rollout_engine_config, trainer_engine_config

DERIVED = {"threads", "lr_decay_steps"}  # the cores; the run's optimizer steps: not defaults


def disagreements(obj) -> list[str]:
    out = []
    for f in dataclasses.fields(obj):
        if not f.init or f.name in DERIVED:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            continue  # no default of its own: the run config's is the only one
        if getattr(obj, f.name) != default:
            out.append(
                f"{type(obj).__name__}.{f.name}: {default!r} vs the run's {getattr(obj, f.name)!r}"
            )
    return out


@pytest.mark.parametrize("overrides", [[], ["trainer=megatron"]], ids=["fsdp", "megatron"])
def test_engine_configs_keep_no_default_that_differs_from_the_run_config(overrides):
    cfg = compose(overrides)
    device = resolve_device("cpu")
    policy = trainer_engine_config(cfg, "policy", "model", device)
    rollout = rollout_engine_config(cfg, "model", "cpu")
    assert disagreements(policy) == [] and disagreements(rollout) == []
    # and the fields without an engine default carry the schema's values
    assert (policy.lr, policy.lr_warmup_steps) == (cfg.trainer.lr, cfg.trainer.lr_warmup_steps)
    assert rollout.kv_cache_gib == cfg.rollout.kv_cache_gib


def test_an_engine_config_built_by_hand_must_say_its_learning_rate():
    from rlpost.trainers.fsdp.engine import FSDPEngineConfig

    with pytest.raises(TypeError, match="lr"):
        FSDPEngineConfig(model_path="m")  # type: ignore[call-arg]
