from trainers.fsdp.engine import FSDPEngine, FSDPEngineConfig

__all__ = ["FSDPEngine", "FSDPEngineConfig"]
