from trainers.fsdp.critic import CriticEngine
from trainers.fsdp.engine import FSDPEngine, FSDPEngineConfig, RegularizerConfig

__all__ = ["CriticEngine", "FSDPEngine", "FSDPEngineConfig", "RegularizerConfig"]
