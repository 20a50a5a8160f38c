from rlpost.trainers.fsdp.critic import CriticEngine
from rlpost.trainers.fsdp.engine import FSDPEngine, FSDPEngineConfig, RegularizerConfig
from rlpost.trainers.fsdp.lora import LoraSettings

__all__ = ["CriticEngine", "FSDPEngine", "FSDPEngineConfig", "LoraSettings", "RegularizerConfig"]
