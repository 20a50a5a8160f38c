"""Colocated memory: when the replicas and the trainer share accelerators
(``trainer.placement=colocated`` on CUDA or Ascend, ``rollout.sleep``), the
replicas free their device memory while the trainer computes, and take it back
in the order that keeps the peak lowest (verl's): the weights first, then the
weight sync writes them, then the KV cache.

- Sleep level 2 drops the weights and the KV cache (the sync after the update
  writes every weight, so nothing is lost); level 1 keeps the weights in host
  memory and is used when ``rollout.lora_sync=adapter`` keeps the base weights
  on the replica and sends only the adapter.
- The trainer's own memory: ``model.param_offload=true`` is FSDP2's
  ``CPUOffloadPolicy``, which keeps parameters, gradients and optimizer state in
  host memory between the layers it computes, so there is nothing of the
  trainer's to move out for generation.

Written for accelerators and not run on them by this project's tests; on the
CPU, vLLM has no sleep mode and ``rollout.sleep=on`` is a config error.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from rlpost.plan.engines import sleeps

if TYPE_CHECKING:
    from rlpost.config.groups import Config
    from rlpost.serving.rollout_group import RolloutGroup

SLEEP_LEVEL = 2  # weights and KV cache dropped
ADAPTER_SLEEP_LEVEL = 1  # weights kept in host memory: only an adapter is synced


class ColocatedMemory:
    """Around each update: ``before_training()``, the trainer's work, then
    ``after_training(sync)`` with the step's weight sync."""

    def __init__(self, rollout: RolloutGroup, level: int):
        self.rollout, self.level = rollout, level

    def before_training(self) -> dict[str, float]:
        start = time.perf_counter()
        self.rollout.sleep(self.level)
        return {"timing/rollout_sleep_s": time.perf_counter() - start}

    def after_training(self, sync: Callable[[], float]) -> dict[str, float]:
        """Wake the weights, ``sync`` them (its seconds are the step's weight-sync
        time), then wake the KV cache."""
        start = time.perf_counter()
        self.rollout.wake(["weights"])
        woken = time.perf_counter() - start
        synced = sync()
        start = time.perf_counter()
        self.rollout.wake(["kv_cache"])
        woken += time.perf_counter() - start
        return {"timing/weight_sync_s": synced, "timing/rollout_wake_s": woken}


def colocated_memory(
    cfg: Config, device_kind: str, rollout: RolloutGroup
) -> ColocatedMemory | None:
    if not sleeps(cfg, device_kind):
        return None
    adapter = cfg.model.lora.rank > 0 and cfg.rollout.lora_sync == "adapter"
    return ColocatedMemory(rollout, ADAPTER_SLEEP_LEVEL if adapter else SLEEP_LEVEL)
