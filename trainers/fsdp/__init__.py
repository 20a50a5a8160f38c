from trainers.fsdp.critic import CriticEngine
from trainers.fsdp.engine import FSDPEngine, FSDPEngineConfig, RegularizerConfig
from trainers.fsdp.lora import LoraSettings

__all__ = ["CriticEngine", "FSDPEngine", "FSDPEngineConfig", "LoraSettings", "RegularizerConfig"]
