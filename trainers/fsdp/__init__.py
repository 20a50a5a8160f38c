"""The FSDP2 backend (``trainer=fsdp``): the policy engine (``engine``), PPO's critic
(``critic``), the reward model (``reward_model``), LoRA (``lora``), sharding and the
update backend they share (``common``) and checkpoint state (``state``)."""

from rlpost.trainers.fsdp.critic import CriticEngine
from rlpost.trainers.fsdp.engine import FSDPEngine, FSDPEngineConfig, RegularizerConfig
from rlpost.trainers.fsdp.lora import LoraSettings

__all__ = ["CriticEngine", "FSDPEngine", "FSDPEngineConfig", "LoraSettings", "RegularizerConfig"]
