"""The policy's weights to every replica over a process group of their own
(``rollout.weight_sync=collective``), or to one colocated replica as memory it
maps (``ipc``, ``IpcSync``), without a copy in Ray's object store.

The group: rank 0 is the trainer's rank 0, ranks 1.. the replicas' engine
workers (``rlpost.runtime.weight_wire.SyncGroup``: its own TCP store, gloo on
the CPU, NCCL on CUDA, a timeout on every collective). On CUDA with vLLM replicas
it is vLLM's own NCCL weight transfer where the installed vLLM has it
(``rlpost.runtime.vllm_transfer``; a watchdog stands in for the timeout). It is opened at the
first sync and opened again, under a new generation, whenever its members
change: a replica restarted or left out.

Faults keep the guarantees of the object-store path:

- a replica that dies during a transfer is found by the failed collective; it
  is restarted (``RolloutGroup._restart``), the group is made again without it
  and the same weights are sent again to the others;
- a restarted replica catches up from the trainer's current weights through
  the object store (one copy, that once), as every replica did before; at the
  next sync it is a member of the group again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import ray

from rlpost.workers.ray_types import ActorHandle

if TYPE_CHECKING:
    from rlpost.config.groups import Config, RolloutConfig
    from rlpost.workers.trainer_worker import TrainerGroup

log = logging.getLogger(__name__)


def weight_sync_mode(setting: str, rollout_name: str, device_kind: str) -> str:
    """What ``rollout.weight_sync`` means for this run: ``auto`` is ``collective``
    on CUDA with vLLM (the GPU path, not measured on this project's CPU machines)
    and the object store elsewhere."""
    if setting != "auto":
        return setting
    from rlpost.runtime import device as devices

    return (
        "collective" if device_kind == devices.CUDA and rollout_name == "vllm" else "object_store"
    )


def bucket_bytes(bucket_mb: float) -> int:
    """``rollout.weight_sync_bucket_mb`` in bytes, as both ends of a sync take it."""
    return max(1, int(bucket_mb * 2**20))


def vllm_transfer_backend(rollout: RolloutConfig, device_kind: str) -> str | None:
    """The backend of vLLM's own weight-transfer engine the collective sync goes
    through (``rlpost.runtime.vllm_transfer.BACKEND``, NCCL) where the sync is
    ``collective``, on CUDA, to vLLM replicas, and the installed vLLM has that
    engine; None where rlpost's own group carries the weights. ``rollout``: the run
    config's ``rollout`` section."""
    from rlpost.runtime import device as devices
    from rlpost.runtime import vllm_transfer

    mode = weight_sync_mode(rollout.weight_sync, rollout.name, device_kind)
    if mode != "collective" or device_kind != devices.CUDA or rollout.name != "vllm":
        return None
    if rollout.pd.enabled:  # a PD replica is two engines with a connector between them
        return None
    return vllm_transfer.BACKEND if vllm_transfer.available() else None


class Replicas(Protocol):
    """What a weight sync reads and calls of the rollout group
    (``rlpost.serving.rollout_group.RolloutGroup``): its replicas' actors, which of
    them are restarting or left out, and its restart path."""

    workers: list[ActorHandle]
    max_restarts: int
    _weights: ray.ObjectRef | Callable[[], ray.ObjectRef] | None
    _restarting: dict[int, tuple[ray.ObjectRef, int, float]]
    _left_out: set[int]

    def _poll_restarts(self, wait: bool = False) -> None: ...

    def _is_current(self, worker: int, exc: ray.exceptions.RayActorError) -> bool: ...

    def _restart(self, worker: int, exc: BaseException) -> None: ...


def collective_sync(
    cfg: Config, device_kind: str, rollout: Replicas
) -> CollectiveSync | IpcSync | None:
    """The run's weight sync without the object store (``collective`` or ``ipc``),
    or None where weights go through the object store (``rollout.weight_sync``; a
    rollout group of another kind, e.g. a test's stand-in, keeps the object store)."""
    r = cfg.rollout
    mode = weight_sync_mode(r.weight_sync, r.name, device_kind)
    if mode not in ("collective", "ipc") or not hasattr(rollout, "load_weights_collective"):
        return None
    if mode == "ipc":
        return IpcSync(rollout, r.weight_sync_bucket_mb)
    via_vllm = vllm_transfer_backend(r, device_kind) is not None
    return CollectiveSync(rollout, r.weight_sync_bucket_mb, r.weight_sync_timeout_s, via_vllm)


def _sync_figures(sent: dict, start: float) -> dict[str, float]:
    """``rollout/weight_sync/*`` of a sync from the sender's figures and its start."""
    return {
        "rollout/weight_sync/buckets": float(sent.get("buckets", 0)),
        "rollout/weight_sync/mb": sent.get("bytes", 0) / 2**20,
        "rollout/weight_sync/peak_bucket_mb": sent.get("peak", 0) / 2**20,
        "rollout/weight_sync/seconds": time.perf_counter() - start,
    }


def _live(group: Replicas) -> list[int]:
    group._poll_restarts()
    return [
        i
        for i in range(len(group.workers))
        if i not in group._restarting and i not in group._left_out
    ]


class CollectiveSync:
    """Send ``trainer``'s weights to ``group``'s replicas, bucket by bucket."""

    def __init__(self, group: Replicas, bucket_mb: float, timeout_s: float, via_vllm: bool = False):
        self.group = group
        self.bucket_bytes = bucket_bytes(bucket_mb)
        self.timeout_s = timeout_s
        # Through vLLM's own NCCL weight transfer (rlpost.runtime.vllm_transfer):
        # the replicas receive by the layout the trainer gives when the group opens.
        self.via_vllm = via_vllm
        self.layout: dict[str, list] | None = None
        self.generation = -1
        self.members: tuple[tuple[int, str], ...] = ()  # (replica, actor id) by rank 1..
        self.rebuilds = 0  # groups made again after a member changed or died

    def _live(self) -> tuple[tuple[int, str], ...]:
        g = self.group
        return tuple((i, g.workers[i]._actor_id.hex()) for i in _live(g))

    def _open(self, trainer: TrainerGroup, members: tuple[tuple[int, str], ...]) -> None:
        if self.generation >= 0:
            self.rebuilds += 1
        self.generation += 1
        world = 1 + len(members)
        address, opened = trainer.open_weight_group(
            world, self.generation, self.timeout_s, self.via_vllm
        )
        joins = [
            self.group.workers[i].open_weight_group.remote(
                address, rank, world, self.generation, self.timeout_s
            )
            for rank, (i, _) in enumerate(members, start=1)
        ]
        self.layout, *_ = ray.get([opened, *joins])
        self.members = members

    def sync(self, trainer: TrainerGroup, version: int, interrupt: bool) -> dict[str, float]:
        """One sync as policy ``version``; returns bucket figures of the last
        attempt (``rollout/weight_sync/*``)."""
        g = self.group
        g._weights = trainer.weights_ref  # what a restarted replica catches up from
        for _ in range(2 + g.max_restarts * len(g.workers)):
            members = self._live()
            if not members:  # every replica is restarting: each catches up by itself
                return {}
            if members != self.members:
                self._open(trainer, members)
            start = time.perf_counter()
            sends = trainer.send_weights(self.bucket_bytes)
            receives = {
                i: g.workers[i].receive_weights.remote(version, interrupt, self.layout)
                for i, _ in members
            }
            died, failed = [], []
            for i, ref in receives.items():
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    if not g._is_current(i, exc):
                        raise
                    died.append(i)
                    g._restart(i, exc)
                except ray.exceptions.RayTaskError as exc:  # its collective failed
                    failed.append(exc)
            try:
                sent = ray.get(sends)[0]
            except ray.exceptions.RayTaskError as exc:
                failed.append(exc)
                sent = {}
            if failed and not died:  # nobody died: a real error
                raise failed[0]
            if not died:
                return {
                    **_sync_figures(sent, start),
                    "rollout/weight_sync/rebuilds": float(self.rebuilds),
                }
            log.warning(
                "rollout replica(s) %s died during a weight transfer; the weight group is "
                "made again and the weights sent again",
                died,
            )
            self.members = ()  # made again at the next attempt
        raise RuntimeError("weight sync: replicas kept dying during the transfer")


class IpcSync:
    """``rollout.weight_sync=ipc``: the trainer hands its weights to one colocated
    replica as memory the replica maps -- CUDA-IPC handles on a GPU, shared-memory
    files on the CPU -- bucket by bucket, with only the handles going through Ray.

    Trainer rank 0 packs each bucket as the replica asks for it
    (``TrainerWorker.ipc_open``/``ipc_next``); the other ranks run their share of
    the gathers meanwhile (``ipc_drive``). A replica that dies mid-transfer is
    restarted and catches up through the object store, as with ``collective``;
    rank 0 finishes the gathers it had left (``ipc_close``) so that the other
    ranks' end too."""

    def __init__(self, group: Replicas, bucket_mb: float):
        self.group = group
        self.bucket_bytes = bucket_bytes(bucket_mb)

    def sync(self, trainer: TrainerGroup, version: int, interrupt: bool) -> dict[str, float]:
        g = self.group
        g._weights = trainer.weights_ref  # what a restarted replica catches up from
        rank0, others = trainer.workers[0], trainer.workers[1:]
        for _ in range(2 + g.max_restarts * len(g.workers)):
            live = _live(g)
            if not live:  # the replica is restarting: it catches up by itself
                return {}
            if len(live) != 1:
                raise RuntimeError(
                    f"rollout.weight_sync=ipc hands weights to one colocated replica, not "
                    f"{len(live)}: use rollout.weight_sync=collective"
                )
            [i] = live
            start = time.perf_counter()
            drives = [w.ipc_drive.remote() for w in others]
            plan = rank0.ipc_open.remote(self.bucket_bytes)
            received = g.workers[i].receive_weights_ipc.remote(rank0, plan, version, interrupt)
            died = False
            try:
                ray.get(received)
            except ray.exceptions.RayActorError as exc:
                if not g._is_current(i, exc):
                    raise
                died = True
                g._restart(i, exc)
            finally:
                sent = ray.get(rank0.ipc_close.remote())
                ray.get(drives)
            if not died:
                return _sync_figures(sent, start)
            log.warning("rollout replica %d died during an ipc weight hand-off; it catches up", i)
        raise RuntimeError("weight sync: the replica kept dying during the hand-off")
