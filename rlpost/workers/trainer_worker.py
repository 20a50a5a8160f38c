"""Ray shell around one training engine rank, and the group of all ranks.

The group's methods are the engine protocols' own (``rlpost.trainers.engine``):
``update_policy = sharded(PolicyEngine.update_policy, mean_metrics)`` makes a
method that splits the batch over the ranks, calls the engine method of that
name on each with its share and combines the answers. mypy checks a call through
the group against the protocol's signature; only the method's name crosses the
Ray boundary, and the worker refuses a name no protocol declares.
"""

from __future__ import annotations

import os
import random
import socket
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Concatenate, ParamSpec, TypeVar

import ray
import torch

from rlpost.runtime.spans import RECORDER, Event, span
from rlpost.trainers.batch import TrajectoryBatch
from rlpost.trainers.engine import PolicyEngine, RewardEngine, ValueEngine, WeightSource
from rlpost.workers import WORKER_ENV
from rlpost.workers.ray_types import ActorHandle, RayOptions, Scheduling

if TYPE_CHECKING:
    from rlpost.runtime.vllm_transfer import VllmNcclSender
    from rlpost.runtime.weight_wire import BucketPlan, IpcSender, SyncGroup
    from rlpost.trainers.engine_config import EngineConfig

QUIET = {"env_vars": WORKER_ENV}
# what an engine must have to be a WeightSource: its attributes and its methods
WEIGHT_SOURCE_MEMBERS = [*WeightSource.__annotations__] + [
    name
    for name in vars(WeightSource)
    if callable(getattr(WeightSource, name)) and not name.startswith("_")
]
P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
Engine = PolicyEngine | ValueEngine | RewardEngine
E = TypeVar("E", bound=Engine)  # the engine protocol a group method comes from
# What a worker may be asked to call on its engine: the protocols' methods.
ENGINE_METHODS = frozenset(
    name
    for protocol in (PolicyEngine, ValueEngine, RewardEngine)
    for name, value in vars(protocol).items()
    if callable(value) and not name.startswith("_")
) | {"named_weights", "weight_stream"}


class TrainerWorker:
    """One rank: owns a training engine (``rlpost.trainers.engine``) and forwards calls to it."""

    def __init__(self, threads: int):
        torch.set_num_threads(threads)
        self.engine: Engine | None = None
        self.weight_source: WeightSource | None = None  # the engine, if its weights can leave it
        # rollout.weight_sync=collective: rank 0's sender
        self.weight_group: SyncGroup | VllmNcclSender | None = None
        self._ipc: IpcSender | None = None  # rollout.weight_sync=ipc: rank 0's hand-off in progress

    def pid(self) -> int:
        """This rank's process id (fault-injection tests kill it)."""
        return os.getpid()

    def address(self) -> str:
        """A free TCP rendezvous address on this worker's node.

        The port comes from below the usual ephemeral range (32768 and up), where
        the outgoing connections of every other process take theirs: one of those
        could take a port from that range between this check and the rendezvous
        server's bind (EADDRINUSE).
        """
        ip = ray.util.get_node_ip_address()
        for _ in range(100):
            port = random.randrange(20000, 32000)
            with socket.socket() as s:
                try:
                    s.bind(("", port))
                except OSError:
                    continue
            return f"tcp://{ip}:{port}"
        with socket.socket() as s:  # that range is full: any free port
            s.bind(("", 0))
            return f"tcp://{ip}:{s.getsockname()[1]}"

    def init_engine(
        self, kind: str, cfg: EngineConfig, rank: int, world_size: int, init_method: str
    ) -> int:
        """Build this rank's engine: the config names the trainer (``cfg.trainer``:
        ``fsdp``, ``megatron``), ``kind`` the role (``policy`` or ``critic``)."""
        from rlpost.trainers.registry import build_engine

        self.engine = build_engine(cfg.trainer, kind, cfg, rank, world_size, init_method)
        if isinstance(self.engine, WeightSource):
            self.weight_source = self.engine
        elif kind == "policy":  # a policy's weights reach the replicas: say what it lacks now
            missing = [m for m in WEIGHT_SOURCE_MEMBERS if not hasattr(self.engine, m)]
            raise TypeError(
                f"{type(self.engine).__name__} is a policy engine but lacks {missing} "
                "(rlpost.trainers.engine.WeightSource)"
            )
        return self.engine.num_params

    def call(self, method: str, *args: object, **kwargs: object) -> object:
        """The engine's ``method`` (a name an engine protocol declares: the group's
        proxies pass ``method.__name__``)."""
        if method not in ENGINE_METHODS:
            raise AttributeError(f"{method!r} is not a method of the engine protocols")
        with span(method, cat="trainer"):
            return getattr(self.engine, method)(*args, **kwargs)

    def trace_events(self, level: str, lane: str) -> list[Event]:
        """This rank's spans since the last call (``rlpost.loop.timeline``), recorded
        at ``level`` from now on under the name ``lane``."""
        RECORDER.configure(level, lane)
        return RECORDER.drain()

    def _weights(self) -> WeightSource:
        if self.weight_source is None:
            raise ValueError(
                f"{type(self.engine).__name__} cannot hand out its weights (a "
                "rollout.weight_sync other than object_store needs a policy engine)"
            )
        return self.weight_source

    def open_weight_group(
        self,
        address: str,
        world_size: int,
        generation: int,
        timeout_s: float,
        via_vllm: bool = False,
    ) -> dict[str, list] | None:
        """Rank 0 of the weight group shared with the rollout replicas' workers
        (``rollout.weight_sync=collective``): its TCP store listens at ``address``
        (``tcp://host:port``, from ``address()``). Blocks until every member joined.

        ``via_vllm``: the group is vLLM's own NCCL weight transfer
        (``rlpost.runtime.vllm_transfer``); returns the layout the replicas receive
        by (None for rlpost's own group, which sends its layout itself)."""
        from rlpost.runtime.device import weight_group_backend
        from rlpost.runtime.weight_wire import SyncGroup

        host, _, port = address.removeprefix("tcp://").rpartition(":")
        if self.weight_group is not None:
            self.weight_group.close()
        source = self._weights()
        if via_vllm:
            from rlpost.runtime import vllm_transfer

            specs = source.weight_stream()[0]  # names, shapes and dtypes only: nothing is gathered
            self.weight_group = vllm_transfer.VllmNcclSender(
                address, world_size, timeout_s, source.device
            )
            return vllm_transfer.layout(specs)
        self.weight_group = SyncGroup(
            host, int(port), 0, world_size, backend=weight_group_backend(source.device),
            timeout_s=timeout_s, generation=generation, device=source.device,
        )  # fmt: skip
        return None

    def send_weights(self, bucket_bytes: int) -> dict[str, int]:
        """Every rank: gather the full weights (collective); rank 0 sends them over
        the weight group in buckets of ``bucket_bytes``. An engine with a
        stream gathers them a layer at a time as the buckets fill."""
        source = self._weights()
        specs, items = source.weight_stream()
        if source.rank != 0:  # gather with rank 0, send nothing
            for _ in items:
                pass
            return {}
        assert self.weight_group is not None, "send_weights before open_weight_group"
        with span("send_weights", cat="sync") as args:
            stats = self.weight_group.send(items, bucket_bytes, specs)
            args.update(buckets=stats.buckets, bytes=stats.bytes)
        return {"buckets": stats.buckets, "bytes": stats.bytes, "peak": stats.peak_bucket_bytes}

    # -- rollout.weight_sync=ipc (rlpost.serving.weight_group.IpcSync) ----------

    def ipc_open(self, bucket_bytes: int) -> BucketPlan:
        """Rank 0: start handing the weights out in buckets of ``bucket_bytes``
        (``ipc_next``); returns their layout. Ends a hand-off left unfinished first."""
        from rlpost.runtime.weight_wire import IpcSender

        self.ipc_close()
        source = self._weights()
        self._ipc = IpcSender(source, bucket_bytes, source.device)
        return self._ipc.plan

    def ipc_next(self) -> tuple:
        """Rank 0: the next bucket's handle (its tensors gathered and packed)."""
        if self._ipc is None:
            raise RuntimeError("ipc_next before ipc_open")
        with span("ipc_bucket", cat="sync"):
            return self._ipc.next()

    def ipc_close(self) -> dict[str, int]:
        """Rank 0: run the gathers the hand-off has left (so the other ranks' ``ipc_drive``
        ends), drop the buckets; returns the sender's figures."""
        sender, self._ipc = self._ipc, None
        return {} if sender is None else sender.close()

    def ipc_drive(self) -> None:
        """Ranks > 0: this rank's share of the gathers of one hand-off, in step with
        rank 0's buckets (the engine's collectives pair them)."""
        for _ in self._weights().weight_stream()[1]:
            pass


def sharded(
    method: Callable[Concatenate[E, TrajectoryBatch, P], R],
    combine: Callable[[list[R], int], T],
) -> Callable[Concatenate[TrainerGroup, TrajectoryBatch, P], T]:
    """A ``TrainerGroup`` method calling the engine protocol's ``method`` on every
    rank with the rank's share of the batch; ``combine(answers, rows)`` joins the
    ranks' answers for a batch of ``rows`` samples. A read-only call's batch is
    padded to split evenly (``rows`` cuts the padding off again); an update's
    batch is split as it is."""
    updates = combine is mean_metrics or combine is metrics_and_rows

    def call(
        group: TrainerGroup, batch: TrajectoryBatch, /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        whole = batch if updates else _padded(batch, group.world_size)
        return combine(group._sharded(method, whole, *args, **kwargs), len(batch))

    call.__name__ = call.__qualname__ = method.__name__
    call.__doc__ = method.__doc__
    return call


def rows(per_rank: list[torch.Tensor], n: int) -> torch.Tensor:
    """The ranks' rows in batch order, without the padding."""
    return torch.cat(per_rank, dim=0)[:n]


def mean_metrics(per_rank: list[dict[str, float]], n: int = 0) -> dict[str, float]:
    """Each metric's mean over the ranks (they are global already, or per-rank
    figures of equal shares)."""
    return {k: sum(m[k] for m in per_rank) / len(per_rank) for k in per_rank[0]}


def metrics_and_rows(
    per_rank: list[tuple[dict[str, float], torch.Tensor]], n: int
) -> tuple[dict[str, float], torch.Tensor]:
    return mean_metrics([m for m, _ in per_rank]), rows([lp for _, lp in per_rank], n)


class TrainerGroup:
    """``world_size`` ranks of one engine kind (``policy`` or ``critic``); data-parallel
    calls split the batch into equal shards.

    ``scheduling`` (one Ray scheduling strategy per rank, e.g. a placement-group
    bundle from ``rlpost.workers.placement``) says where each rank runs; None lets Ray choose.
    """

    def __init__(
        self,
        engine_cfg: EngineConfig,
        world_size: int,
        num_cpus: float,
        threads: int,
        device_opts: RayOptions,
        kind: str = "policy",
        scheduling: Sequence[Scheduling] | None = None,
    ):
        cls = ray.remote(num_cpus=num_cpus, runtime_env=QUIET, **device_opts)(TrainerWorker)
        where: Sequence[Scheduling] = scheduling or [None] * world_size
        assert len(where) == world_size, "one scheduling strategy per rank"
        self.workers: list[ActorHandle] = [
            cls.options(scheduling_strategy=s).remote(threads) for s in where
        ]
        self.world_size = world_size
        init_method = ray.get(self.workers[0].address.remote())
        sizes = ray.get(
            [
                w.init_engine.remote(kind, engine_cfg, rank, world_size, init_method)
                for rank, w in enumerate(self.workers)
            ]
        )
        self.num_params = sizes[0]

    def _sharded(
        self,
        method: Callable[Concatenate[E, TrajectoryBatch, P], R],
        batch: TrajectoryBatch,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> list[R]:
        shards = [batch.shard(r, self.world_size) for r in range(self.world_size)]
        return _gather(
            [
                w.call.remote(method.__name__, s, *args, **kwargs)
                for w, s in zip(self.workers, shards)
            ]
        )

    def _each(
        self, method: Callable[Concatenate[E, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> list[R]:
        return _gather([w.call.remote(method.__name__, *args, **kwargs) for w in self.workers])

    def owns(self, actor_id: str | None) -> bool:
        """Whether ``actor_id`` (hex, as in ``RayActorError.actor_id``) is one of the ranks."""
        return any(w._actor_id.hex() == actor_id for w in self.workers)

    def pids(self) -> list[int]:
        return _gather([w.pid.remote() for w in self.workers])

    def has_dropout(self) -> bool:
        """Whether a training-mode forward of rank 0's model is random (dropout)."""
        return bool(_gather([self.workers[0].call.remote(PolicyEngine.has_dropout.__name__)])[0])

    def save_checkpoint(self, path: str) -> None:
        self._each(PolicyEngine.save_checkpoint, path)

    def load_checkpoint(self, path: str) -> None:
        self._each(PolicyEngine.load_checkpoint, path)

    def save_hf(self, out_dir: str) -> str | None:
        return self._each(PolicyEngine.save_hf, out_dir)[0]

    def adapter_ref(self) -> ray.ObjectRef:
        """An object-store reference to rank 0's LoRA adapter ``(tensors, peft_config)``."""
        refs = [w.call.remote(PolicyEngine.adapter_weights.__name__) for w in self.workers]
        _gather(refs[1:])
        return refs[0]

    def open_weight_group(
        self, world_size: int, generation: int, timeout_s: float, via_vllm: bool = False
    ) -> tuple[str, ray.ObjectRef]:
        """The weight group's address on rank 0's node and the call that opens it
        there (it returns once the replicas' workers have joined, with the layout
        they receive by when ``via_vllm``: ``TrainerWorker.open_weight_group``)."""
        address = ray.get(self.workers[0].address.remote())
        opened = self.workers[0].open_weight_group.remote(
            address, world_size, generation, timeout_s, via_vllm
        )
        return address, opened

    def send_weights(self, bucket_bytes: int) -> list[ray.ObjectRef]:
        """Every rank gathers the weights, rank 0 sends them (``open_weight_group``);
        the calls, rank 0's first (its bucket counts)."""
        return [w.send_weights.remote(bucket_bytes) for w in self.workers]

    def weights_ref(self) -> ray.ObjectRef:
        """An object-store reference to rank 0's full weights (one copy, fetched by replicas)."""
        refs = [w.call.remote(PolicyEngine.named_weights.__name__) for w in self.workers]
        _gather(refs[1:])
        return refs[0]

    # -- data-parallel calls: the engine protocols' methods -----------------------
    logprobs = sharded(PolicyEngine.logprobs, rows)
    ref_logprobs = sharded(PolicyEngine.ref_logprobs, rows)
    greedy_match = sharded(PolicyEngine.greedy_match, rows)
    update_policy = sharded(PolicyEngine.update_policy, mean_metrics)
    # one update whose old log-probs are its own: the metrics and those log-probs (b, t)
    update_policy_single_pass = sharded(PolicyEngine.update_policy_single_pass, metrics_and_rows)
    update_sft = sharded(PolicyEngine.update_sft, mean_metrics)
    # pairs stay whole in each rank's share
    update_preference = sharded(PolicyEngine.update_preference, mean_metrics)
    values = sharded(ValueEngine.values, rows)
    update_critic = sharded(ValueEngine.update_critic, mean_metrics)
    rewards = sharded(RewardEngine.rewards, rows)
    update_reward_model = sharded(RewardEngine.update_reward_model, mean_metrics)

    def close(self, timeout_s: float = 60.0) -> None:
        """Close each rank's engine, then end the actors. Once one rank is found dead
        the others are ended at once: a survivor may be stuck in a collective with
        the dead rank (NCCL waits for its timeout), and its close would queue behind
        that call until ``timeout_s``."""
        pending = [w.call.remote(PolicyEngine.close.__name__) for w in self.workers]
        deadline = time.monotonic() + timeout_s
        try:
            while pending:
                ready, pending = ray.wait(pending, timeout=max(deadline - time.monotonic(), 0))
                if not ready:
                    break  # the deadline passed
                try:
                    ray.get(ready)
                except ray.exceptions.RayActorError:
                    break  # a rank is dead: end them all now
        finally:
            for w in self.workers:
                ray.kill(w)


def _gather(refs: list[ray.ObjectRef[T]], settle_s: float = 10.0) -> list[T]:
    """``ray.get(refs)``, but raising as soon as one rank fails: the others may be
    waiting for the dead one in a collective until the backend's timeout.

    When a rank was killed, its survivors' collectives fail too (gloo: "Connection
    reset by peer"), often before Ray reports the death. The death is what the
    caller can act on (``Controller.restart_trainers``), so after a failed call the
    other ranks get up to ``settle_s`` seconds to show one (a ``RayActorError``),
    which is raised instead.
    """
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        try:
            ray.get(ready)
        except ray.exceptions.RayActorError:
            raise
        except ray.exceptions.RayError as exc:
            died = _dead_rank(pending, settle_s)
            if died is not None:
                raise died from exc
            raise
    return ray.get(refs)


def _dead_rank(refs: list[ray.ObjectRef], timeout_s: float) -> ray.exceptions.RayActorError | None:
    """The error of the first of ``refs`` whose rank died within ``timeout_s``, if any."""
    deadline = time.monotonic() + timeout_s
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, timeout=max(deadline - time.monotonic(), 0))
        if not ready:
            return None
        try:
            ray.get(ready)
        except ray.exceptions.RayActorError as exc:
            return exc
        except ray.exceptions.RayError:
            pass  # this rank failed too, but is alive
    return None


def _padded(batch: TrajectoryBatch, world_size: int) -> TrajectoryBatch:
    """Repeat the last rows so the batch splits evenly (for read-only calls)."""
    extra = -len(batch) % world_size
    if not extra:
        return batch
    index = torch.cat([torch.arange(len(batch)), torch.full((extra,), len(batch) - 1)])
    return batch.select(index)
