"""What a rollout replica's engine worker reads during a colocated weight
hand-off (``rollout.weight_sync=ipc``; the driver's side is
``rlpost.serving.weight_group.IpcSync``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import ray

from rlpost.workers.ray_types import ActorHandle

if TYPE_CHECKING:
    import torch

    from rlpost.runtime.weight_wire import BucketPlan, SyncStats


class IpcSource:
    """What a replica's engine worker reads during an ``ipc`` sync: the buckets of
    ``plan`` from the trainer's rank 0 (``sender``, a ``TrainerWorker``), one at a
    time, mapped in place (``rlpost.runtime.weight_wire.open_bucket``). It asks
    for the next bucket once the model's loader has taken the last one's tensors."""

    def __init__(self, sender: ActorHandle, plan: BucketPlan):
        self.sender, self.plan = sender, plan

    def tensors(self, stats: SyncStats) -> Iterator[tuple[str, torch.Tensor]]:
        from rlpost.runtime import device as devices
        from rlpost.runtime.weight_wire import open_bucket, unpack

        for slots, size in zip(self.plan.buckets, self.plan.sizes):
            # The engine is paused for the sync, so blocking its loop here is intended.
            handle = ray.get(self.sender.ipc_next.remote())
            buffer = open_bucket(handle)
            stats.hold(size)
            stats.buckets += 1
            stats.bytes += size
            yield from unpack(slots, buffer)
            if buffer.device.type != "cpu":  # the loader's copies are done before it goes
                devices.synchronize(buffer.device.type)
            del buffer
            stats.release(size)
