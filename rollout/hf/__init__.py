"""A transformers ``generate`` rollout engine (``engine``): the portable reference,
no vLLM and no prefix cache."""

from rlpost.rollout.hf.engine import HFEngine, HFEngineConfig

__all__ = ["HFEngine", "HFEngineConfig"]
