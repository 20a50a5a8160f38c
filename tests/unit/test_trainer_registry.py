"""The trainer registry: an engine config names its trainer, and each name and role
resolves to an engine class without building it."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from rlpost.trainers.fsdp.engine import FSDPEngine, FSDPEngineConfig
from rlpost.trainers.megatron.config import MegatronEngineConfig
from rlpost.trainers.registry import ENGINES, build_engine


def test_configs_name_their_trainer():
    assert FSDPEngineConfig.trainer == "fsdp"
    assert MegatronEngineConfig.trainer == "megatron"
    # a class attribute, not a field: the checkpoint's engine.json does not change
    assert "trainer" not in dataclasses.asdict(
        FSDPEngineConfig(model_path="unused", lr=1e-3, lr_warmup_steps=0)
    )


def test_every_entry_names_a_class():
    module, cls = ENGINES["fsdp"]["policy"].split(":")
    assert getattr(importlib.import_module(module), cls) is FSDPEngine
    roles = {role for roles in ENGINES.values() for role in roles}
    assert roles == {"policy", "critic", "reward_model"}  # reward_model: algo=rm, fsdp only


def test_unknown_names_list_the_choices():
    cfg = FSDPEngineConfig(model_path="unused", lr=1e-3, lr_warmup_steps=0)
    with pytest.raises(KeyError, match=r"unknown trainer 'jax'.*\['fsdp', 'megatron'\]"):
        build_engine("jax", "policy", cfg, 0, 1, "tcp://127.0.0.1:1")
    with pytest.raises(KeyError, match=r"no 'reward' engine; it has \['critic', 'policy', 're"):
        build_engine("fsdp", "reward", cfg, 0, 1, "tcp://127.0.0.1:1")
    with pytest.raises(KeyError, match=r"no 'reward_model' engine; it has \['critic', 'policy'\]"):
        build_engine("megatron", "reward_model", cfg, 0, 1, "tcp://127.0.0.1:1")
