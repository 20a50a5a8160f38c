"""The policy's weights to the rollout replicas, through one interface.

``WeightSync`` owns the policy version the replicas serve and pushes the
policy's weights to them with one ``Transport``, chosen once for the run
(``weight_sync``):

- ``object_store``: one copy of the weights in Ray's object store, fetched by
  every replica (``RolloutGroup.load_weights``);
- ``adapter``: only the LoRA adapter, through the object store
  (``rollout.lora_sync=adapter``);
- ``collective`` (vLLM's own NCCL engine on CUDA where it has one) and ``ipc``:
  bucket by bucket without the object store (``rlpost.serving.weight_group``).

Where the replicas sleep while the trainer computes (``rlpost.loop.memory``),
``release`` frees their memory and the next ``push`` takes it back around the
transfer.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from rlpost.runtime.spans import span
from rlpost.serving.weight_group import CollectiveSync, IpcSync, collective_sync

if TYPE_CHECKING:
    from rlpost.config.groups import Config
    from rlpost.loop.memory import ColocatedMemory
    from rlpost.loop.roles import Workers
    from rlpost.serving.rollout_group import RolloutGroup
    from rlpost.workers.trainer_worker import TrainerGroup


class Transport(Protocol):
    """One way of moving the policy's weights to the replicas; returns the
    transfer's own figures (``rollout/weight_sync/*``), if it has any."""

    name: str

    def send(self, policy: TrainerGroup, version: int, interrupt: bool) -> dict[str, float]: ...


class ObjectStoreTransport:
    name = "object_store"

    def __init__(self, rollout: RolloutGroup):
        self.rollout = rollout

    def send(self, policy: TrainerGroup, version: int, interrupt: bool) -> dict[str, float]:
        self.rollout.load_weights(policy.weights_ref(), version, interrupt)
        return {}


class AdapterTransport:
    name = "adapter"

    def __init__(self, rollout: RolloutGroup):
        self.rollout = rollout

    def send(self, policy: TrainerGroup, version: int, interrupt: bool) -> dict[str, float]:
        self.rollout.load_lora_adapter(policy.adapter_ref(), version, interrupt)
        return {}


class GroupTransport:
    """``collective`` or ``ipc``: the trainer sends its weights in buckets over a
    process group of its own, or hands them to a colocated replica as memory."""

    def __init__(self, rollout: RolloutGroup, sync: CollectiveSync | IpcSync):
        self.rollout, self.sync = rollout, sync
        self.name = "ipc" if isinstance(sync, IpcSync) else "collective"

    def send(self, policy: TrainerGroup, version: int, interrupt: bool) -> dict[str, float]:
        return self.rollout.load_weights_collective(self.sync, policy, version, interrupt)


class WeightSync:
    """Pushes ``workers.policy``'s weights to ``workers.rollout`` as a policy version.

    ``version``: the version the replicas serve (the policy's completed updates),
    stamped on every token they sample. ``figures``: the last transfer's own
    figures, logged with every step until the next one.
    """

    def __init__(
        self, workers: Workers, transport: Transport, memory: ColocatedMemory | None = None
    ):
        self.workers, self.transport, self.memory = workers, transport, memory
        self.version = 0
        self.figures: dict[str, float] = {}
        self.asleep = False

    def release(self) -> dict[str, float]:
        """Colocated replicas free their device memory for the trainer's work."""
        if self.memory is None:
            return {}
        self.asleep = True
        return self.memory.before_training()

    def push(self, version: int | None = None, interrupt: bool = False) -> dict[str, float]:
        """The policy's weights to every replica, as ``version`` (default: the
        current one); ``interrupt``: requests in flight continue under them.
        Returns ``timing/weight_sync_s`` (and the wake-up's time, where the
        replicas slept)."""
        if version is not None:
            self.version = version
        if self.memory is not None and self.asleep:
            self.asleep = False
            return self.memory.after_training(lambda: self._send(interrupt))
        return {"timing/weight_sync_s": self._send(interrupt)}

    def _send(self, interrupt: bool) -> float:
        start = time.perf_counter()
        with span("push_weights", cat="sync", version=self.version, interrupt=interrupt):
            self.figures = self.transport.send(self.workers.policy, self.version, interrupt)
        return time.perf_counter() - start


def weight_sync(
    cfg: Config, device_kind: str, workers: Workers, memory: ColocatedMemory | None = None
) -> WeightSync:
    """The run's weight sync: ``rollout.lora_sync=adapter`` sends the adapter,
    else ``rollout.weight_sync`` (``auto``: collective on CUDA with vLLM, the
    object store elsewhere) picks the transport. ``memory``: the colocated
    replicas' sleep schedule, where they sleep (``rlpost.loop.memory``)."""
    rollout = workers.rollout
    transport: Transport
    group = collective_sync(cfg, device_kind, rollout)
    if cfg.model.lora.rank and cfg.rollout.lora_sync == "adapter":
        transport = AdapterTransport(rollout)
    elif group is not None:
        transport = GroupTransport(rollout, group)
    else:
        transport = ObjectStoreTransport(rollout)
    return WeightSync(workers, transport, memory)
