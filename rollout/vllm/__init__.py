from rlpost.rollout.vllm.engine import VLLMEngine, VLLMEngineConfig

__all__ = ["VLLMEngine", "VLLMEngineConfig"]
