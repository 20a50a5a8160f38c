"""Rollout engines by name (``rollout.name``): each entry an engine class and its config."""

from __future__ import annotations

import importlib

from rlpost.rollout.base import AsyncRolloutEngine

# name -> "module:EngineClass"; imported on use so each backend stays optional.
ENGINES: dict[str, str] = {
    "vllm": "rlpost.rollout.vllm.engine:VLLMEngine",
    "hf": "rlpost.rollout.hf.engine:HFEngine",
    # CUDA only: an sglang.Engine per replica; prefill/decode servers behind SGLang's router.
    "sglang": "rlpost.rollout.sglang.engine:SGLangEngine",
    "sglang_pd": "rlpost.rollout.sglang.pd:SGLangPDEngine",
}


def build_engine(name: str, cfg: object) -> AsyncRolloutEngine:
    """The engine ``name`` built from its config (``VLLMEngineConfig``, ``HFEngineConfig``)."""
    if name not in ENGINES:
        raise KeyError(f"unknown rollout engine {name!r}; choose one of {sorted(ENGINES)}")
    module, cls = ENGINES[name].split(":")
    return getattr(importlib.import_module(module), cls)(cfg)
