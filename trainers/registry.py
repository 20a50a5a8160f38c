"""Training engines by name (the engine config's ``trainer``) and role (``policy``,
``critic`` or ``reward_model``): each entry a ``module:Class`` built from the config, the rank, the
world size and the rendezvous address."""

from __future__ import annotations

import importlib

from rlpost.trainers.engine import PolicyEngine, RewardEngine, ValueEngine
from rlpost.trainers.engine_config import EngineConfig

# name -> role -> "module:EngineClass"; imported on use, so an FSDP run never imports megatron.
ENGINES: dict[str, dict[str, str]] = {
    "fsdp": {
        "policy": "rlpost.trainers.fsdp.engine:FSDPEngine",
        "critic": "rlpost.trainers.fsdp.critic:CriticEngine",
        "reward_model": "rlpost.trainers.fsdp.reward_model:RewardModelEngine",
    },
    "megatron": {
        "policy": "rlpost.trainers.megatron.engine:MegatronEngine",
        "critic": "rlpost.trainers.megatron.critic:MegatronCriticEngine",
    },
}


def build_engine(
    name: str, role: str, cfg: EngineConfig, rank: int, world_size: int, init_method: str
) -> PolicyEngine | ValueEngine | RewardEngine:
    """This rank's ``role`` engine of trainer ``name`` (e.g. ``FSDPEngine`` for
    ``fsdp`` / ``policy``), built from its config. Collective: every rank builds one."""
    if name not in ENGINES:
        raise KeyError(f"unknown trainer {name!r}; choose one of {sorted(ENGINES)}")
    roles = ENGINES[name]
    if role not in roles:
        raise KeyError(f"trainer {name!r} has no {role!r} engine; it has {sorted(roles)}")
    module, cls = roles[role].split(":")
    return getattr(importlib.import_module(module), cls)(cfg, rank, world_size, init_method)
