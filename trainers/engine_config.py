"""What every training engine is built from: the model, the optimizer's settings
and how a batch is cut into micro-batches. Each engine's config adds its own
fields (``FSDPEngineConfig``, ``MegatronEngineConfig``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:  # the run config's schema imports this module: no torch at start-up
    import torch

DTYPE_NAMES = ("float32", "bfloat16", "float16")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype an engine's ``dtype`` names (one of ``DTYPE_NAMES``)."""
    import torch

    if name not in DTYPE_NAMES:
        raise ValueError(f"dtype={name!r}: choose one of {', '.join(DTYPE_NAMES)}")
    return getattr(torch, name)


@dataclass(frozen=True)
class EngineConfig:
    # The trainer's name in ``rlpost.trainers.registry.ENGINES`` (set by each backend).
    trainer: ClassVar[str]

    model_path: str
    dtype: str = "float32"
    # No defaults of their own for what the run config sets (its schema holds the
    # defaults, rlpost/plan/engines.py turns it into this): built by hand, say them.
    lr: float = field(kw_only=True)
    lr_warmup_steps: int = field(kw_only=True)
    lr_schedule: str = "constant"  # after the warm-up: constant, linear or cosine decay
    lr_decay_steps: int = 0  # optimizer steps the decay spans (the run's)
    lr_min_ratio: float = 0.0  # the decay's floor, a share of lr
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)
    max_grad_norm: float = 1.0
    micro_batch_size: int = 64
    seed: int = 0
    device: str = "cpu"
    backend: str = "gloo"
    threads: int = 1
    trainable: bool = True  # False: a frozen reference policy (no optimizer state)
    micro_batch_tokens: int = 0  # > 0: micro-batches by token budget, not micro_batch_size
    packing: bool = False  # one unpadded row per micro-batch, positions restart per sample
    # off, on or auto: samples of a micro-batch with a common prefix run it once
    # (trainers/prefix_sharing.py); auto where it saves a fifth of the tokens
    prefix_sharing: str = "off"
