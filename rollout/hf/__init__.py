from rlpost.rollout.hf.engine import HFEngine, HFEngineConfig

__all__ = ["HFEngine", "HFEngineConfig"]
