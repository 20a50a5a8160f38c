"""Weights from a trainer to a rollout replica's workers in buckets, over a
process group of their own (``rollout.weight_sync=collective``) or as memory a
colocated replica maps (``ipc``: CUDA-IPC handles on a GPU, shared memory on the
CPU), without Ray's object store.

- **Buckets.** ``plan_buckets`` lays the tensors out, in order, in buckets of
  at most ``bucket_bytes`` (a tensor larger than that gets a bucket of its
  own); each tensor starts at an aligned offset so that it can be read back as
  a view of the bucket's bytes. The plan -- names, shapes, dtypes, offsets --
  is sent once per group and checked against the tensors of every later sync.
- **The group.** ``SyncGroup`` is a stateless process group: its own TCP store
  and its own gloo (CPU), NCCL (CUDA) or HCCL (Ascend) group, never the trainer's default
  group, with a timeout, so a replica that dies mid-transfer surfaces as an
  error on the trainer instead of a hang, and the group can be rebuilt.
- **Memory.** The sender packs one bucket at a time from an iterator (a
  sharded trainer gathers each part as the iterator reaches it), copying each
  tensor in as it comes, and sends a tensor with a bucket of its own as it is;
  the receiver hands a bucket's tensors on as views and receives the next bucket
  into new memory, so while it does, the loader may still hold the previous
  bucket's last view. So neither side holds more than two buckets beyond its own
  weights: the sender a bucket and the part being gathered (1.0-1.7 times the
  largest bucket), the receiver the bucket arriving and at most the one before
  (1.1-2.0 times; two when the tied head follows the embedding);
  bench/results/stream_memory.md. ``SyncStats`` records the bucket bytes each
  side held at once in its own hands (the receiver's excludes a view the loader
  still holds).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.multiprocessing.reductions import StorageWeakRef

from rlpost.runtime import device as devices

ALIGN = 64  # bytes: every tensor's offset in its bucket is a multiple of this
DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool,
)}  # fmt: skip


@dataclass(frozen=True)
class TensorSlot:
    """Where one tensor lives in its bucket."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    offset: int  # bytes from the bucket's start
    nbytes: int


@dataclass(frozen=True)
class BucketPlan:
    buckets: tuple[tuple[TensorSlot, ...], ...]
    sizes: tuple[int, ...]  # bytes of each bucket

    @property
    def digest(self) -> str:
        """A short hash of the layout: sender and receiver compare it every sync."""
        return hashlib.sha256(pickle.dumps(self.buckets)).hexdigest()[:16]

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    n = 1
    for s in shape:
        n *= s
    return n * torch.empty((), dtype=dtype).element_size()


def plan_buckets(
    specs: Iterable[tuple[str, tuple[int, ...], torch.dtype]], bucket_bytes: int
) -> BucketPlan:
    """Buckets of at most ``bucket_bytes`` holding ``specs`` (name, shape, dtype) in
    order; a tensor larger than a bucket has one of its own."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes={bucket_bytes}: must be > 0")
    buckets: list[list[TensorSlot]] = [[]]
    sizes = [0]
    for name, shape, dtype in specs:
        nbytes = _nbytes(tuple(shape), dtype)
        offset = -(-sizes[-1] // ALIGN) * ALIGN
        if buckets[-1] and offset + nbytes > bucket_bytes:
            buckets.append([])
            sizes.append(0)
            offset = 0
        key = str(dtype).removeprefix("torch.")
        if key not in DTYPES:
            raise ValueError(f"{name}: dtype {dtype} cannot be sent in a weight bucket")
        buckets[-1].append(TensorSlot(name, tuple(shape), key, offset, nbytes))
        sizes[-1] = offset + nbytes
    if not buckets[-1]:
        buckets.pop()
        sizes.pop()
    return BucketPlan(tuple(tuple(b) for b in buckets), tuple(sizes))


def _check(slot: TensorSlot, tensor: torch.Tensor) -> None:
    if tuple(tensor.shape) != slot.shape or str(tensor.dtype).removeprefix("torch.") != slot.dtype:
        raise ValueError(
            f"{slot.name}: {tuple(tensor.shape)} {tensor.dtype} does not match the plan's "
            f"{slot.shape} {slot.dtype} (the model changed between syncs: rebuild the group)"
        )


def pack(slots: tuple[TensorSlot, ...], tensors: list[torch.Tensor], out: torch.Tensor) -> None:
    """Copy ``tensors`` (one per slot, in order) into the bytes ``out``."""
    for slot, tensor in zip(slots, tensors, strict=True):
        _check(slot, tensor)
        view = out[slot.offset : slot.offset + slot.nbytes]
        view.copy_(tensor.detach().contiguous().reshape(-1).view(torch.uint8))


def bucket_as_is(
    slots: tuple[TensorSlot, ...], tensors: list[torch.Tensor], device: torch.device
) -> torch.Tensor | None:
    """The bytes of a bucket that holds one tensor (one as large as a bucket or
    larger) as that tensor's own memory, where it is contiguous on ``device``: the
    same bytes ``pack`` would copy, without the copy. None otherwise."""
    if len(slots) != 1:
        return None
    [slot], [tensor] = slots, tensors
    _check(slot, tensor)
    if tensor.device.type != device.type or not tensor.is_contiguous():
        return None
    return tensor.detach().reshape(-1).view(torch.uint8)


def unpack(slots: tuple[TensorSlot, ...], buffer: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """The tensors of one bucket, as views of ``buffer``'s bytes."""
    out = []
    for slot in slots:
        raw = buffer[slot.offset : slot.offset + slot.nbytes]
        out.append((slot.name, raw.view(DTYPES[slot.dtype]).view(slot.shape)))
    return out


@dataclass
class SyncStats:
    """What one side of a sync did: buckets, bytes, and the most bucket bytes it held
    at once (the memory beyond its own weights)."""

    buckets: int = 0
    bytes: int = 0
    peak_bucket_bytes: int = 0
    held: int = field(default=0, repr=False)

    def hold(self, nbytes: int) -> None:
        self.held += nbytes
        self.peak_bucket_bytes = max(self.peak_bucket_bytes, self.held)

    def release(self, nbytes: int) -> None:
        self.held -= nbytes


# torch's stubs give the c10d backends (``ProcessGroupGloo``, ``ProcessGroupNCCL``, an
# extension's) no collectives, so the group a ``SyncGroup`` broadcasts over is untyped.
def plugin_group(
    backend: str, store: dist.Store, rank: int, world_size: int, timeout: timedelta
) -> Any:
    """A process group of a backend that a device extension registered with
    ``torch.distributed.Backend.register_backend`` (``torch_npu``: ``hccl``), made
    on ``store`` as the extension's own creator makes it."""
    plugin = dist.Backend._plugins.get(backend.upper())
    if plugin is None:
        raise ValueError(
            f"weight sync backend {backend!r} is not registered with torch.distributed: "
            f"the device's extension (torch_npu for hccl) registers it on import; or use "
            "rollout.weight_sync=object_store"
        )
    return plugin.creator_fn(store, rank, world_size, timeout)


class SyncGroup:
    """One trainer rank (rank 0, the sender) and a replica's workers (ranks 1..)
    in a process group of their own.

    ``host``/``port``: the sender's TCP store, which rank 0 creates. ``backend``:
    ``gloo`` on the CPU, ``nccl`` on CUDA, ``hccl`` on Ascend. Every collective waits at most
    ``timeout_s``; a peer that died makes it raise, and the group is then closed
    and made again (with a new ``generation``, so no key of the old one is read).
    """

    def __init__(
        self,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        backend: str = "gloo",
        timeout_s: float = 120.0,
        generation: int = 0,
        device: torch.device | None = None,
    ):
        self.rank, self.world_size, self.backend = rank, world_size, backend
        self.device = device or torch.device("cpu")
        timeout = timedelta(seconds=timeout_s)
        self.store: dist.TCPStore | None = dist.TCPStore(
            host, port, world_size, is_master=rank == 0, timeout=timeout, wait_for_workers=False
        )
        prefixed = dist.PrefixStore(f"rlpost-weights-{generation}", self.store)
        if backend == "gloo":
            # a c10d backend, untyped as ``plugin_group``'s is
            self.pg: Any = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
        elif backend == devices.kind(devices.CUDA).backend:  # CUDA; not run on the CPU here
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.pg = dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
        else:  # HCCL: a backend its device's extension registers with torch.distributed
            self.pg = plugin_group(backend, prefixed, rank, world_size, timeout)
        self.plan: BucketPlan | None = None  # what the receiver last got, or the sender sent

    def broadcast(self, tensor: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.pg.broadcast([tensor], opts).wait()

    def _broadcast_object(self, obj: object) -> Any:
        """``obj`` as rank 0 gave it, on every rank (unpickled: whatever rank 0 sent)."""
        data = pickle.dumps(obj) if self.rank == 0 else b""
        size = torch.tensor([len(data)], dtype=torch.int64, device=self.device)
        self.broadcast(size)
        buf = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
        if self.rank == 0:
            buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        self.broadcast(buf)
        return pickle.loads(buf.cpu().numpy().tobytes()) if self.rank else obj

    # -- sender -----------------------------------------------------------

    def send(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        bucket_bytes: int,
        specs: list[tuple[str, tuple[int, ...], torch.dtype]] | None = None,
    ) -> SyncStats:
        """Rank 0: broadcast ``named_tensors`` bucket by bucket. ``specs`` (name,
        shape, dtype of each, in order) lets the plan be made before the tensors
        exist (a sharded trainer gathers each one as the iterator reaches it);
        without it the tensors are listed first."""
        if self.rank != 0:
            raise RuntimeError("SyncGroup.send runs on rank 0 (the trainer)")
        items: Iterator[tuple[str, torch.Tensor]]
        if specs is None:
            listed = list(named_tensors)
            specs = [(n, tuple(t.shape), t.dtype) for n, t in listed]
            items = iter(listed)
        else:
            items = iter(named_tensors)
        plan = plan_buckets(specs, bucket_bytes)
        new_layout = self.plan is None or self.plan.digest != plan.digest
        # The layout once (a flag and the plan), then only its digest.
        self._broadcast_object(("plan", plan) if new_layout else ("digest", plan.digest))
        self.plan = plan
        stats = SyncStats()
        for slots, size in zip(plan.buckets, plan.sizes):
            first = [tensor.to(self.device) for tensor in take(items, slots[:1])]
            # a tensor with a bucket of its own goes as it is: no second copy of it
            buffer = bucket_as_is(slots, first, self.device)
            if buffer is None:
                buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
                fill(buffer, slots, first, items, self.device)
            del first
            stats.hold(size)
            self.broadcast(buffer)
            stats.buckets += 1
            stats.bytes += size
            del buffer
            stats.release(size)
        return stats

    # -- receiver ---------------------------------------------------------

    def receive(self, stats: SyncStats | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Ranks > 0: the tensors rank 0 sends, as views of the current bucket --
        use (copy) each before asking for the next bucket's."""
        kind, value = self._broadcast_object(None)
        if kind == "plan":
            self.plan = value
        elif self.plan is None or value != self.plan.digest:
            raise RuntimeError("weight sync: the sender's layout is not the one this worker has")
        assert self.plan is not None
        stats = stats if stats is not None else SyncStats()
        for slots, size in zip(self.plan.buckets, self.plan.sizes):
            buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
            stats.hold(size)
            self.broadcast(buffer)
            stats.buckets += 1
            stats.bytes += size
            yield from unpack(slots, buffer)
            del buffer
            stats.release(size)

    def close(self) -> None:
        self.pg = None
        self.store = None


def fill(
    out: torch.Tensor,
    slots: tuple[TensorSlot, ...],
    first: list[torch.Tensor],
    items: Iterator[tuple[str, torch.Tensor]],
    device: torch.device,
) -> None:
    """Pack the bucket ``out`` as its tensors come: ``first`` (the first slots'
    tensors, taken already; emptied here), then the rest of ``slots`` from ``items``.
    Each is copied in and let go before the next is asked for (which may gather the
    next part), so the sender holds the bucket and one part, not the bucket twice."""
    done = len(first)
    pack(slots[:done], [t.to(device) for t in first], out)
    first.clear()
    for slot in slots[done:]:
        pack((slot,), [t.to(device) for t in take(items, (slot,))], out)


def take(items: Iterator[tuple[str, torch.Tensor]], slots: tuple[TensorSlot, ...]) -> list:
    """The next tensors of ``items``, one per slot, checked against the slots' names."""
    tensors = []
    for slot in slots:
        name, tensor = next(items)
        if name != slot.name:
            raise ValueError(f"weight sync: got {name} where the plan has {slot.name}")
        tensors.append(tensor)
    return tensors


# -- colocated hand-off (rollout.weight_sync=ipc) ---------------------------
#
# The trainer packs each bucket into memory the replica's process maps: a CUDA
# allocation shared by CUDA-IPC handle on a GPU, a file in /dev/shm (POSIX shared
# memory) on the CPU. Only the handle (a few hundred bytes) goes through Ray; the
# receiver reads the weights in place, so sender and receiver share one copy of
# the bucket. The sender keeps only the bucket it packed last: the receiver asks
# for the next one when it is done with the last, and its mapping keeps a dropped
# bucket's memory until it lets go of its views (an unlinked file stays mapped;
# torch counts CUDA-IPC references before it reuses the memory).


# What ``torch.multiprocessing.reductions.reduce_tensor`` makes of a CUDA tensor: the
# function that rebuilds it in another process, and that function's arguments.
IpcHandle = tuple[Callable[..., torch.Tensor], tuple[object, ...]]


def ipc_handles(buffer: torch.Tensor) -> IpcHandle:
    """A picklable handle of a CUDA bucket another process on the same device can
    open (``open_ipc``) without a copy through the host."""
    from torch.multiprocessing.reductions import reduce_tensor

    if buffer.device.type == "cpu":
        raise ValueError("ipc handles need a CUDA tensor; on the CPU use shared_bucket")
    return reduce_tensor(buffer)


def open_ipc(handle: IpcHandle) -> torch.Tensor:
    rebuild, args = handle
    return rebuild(*args)


def shm_dir() -> str:
    """Where the CPU's shared-memory buckets live."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


@dataclass(eq=False)
class SharedBucket:
    """One bucket's memory on the sender's side and the handle that opens it."""

    buffer: torch.Tensor
    handle: tuple
    path: str | None = None  # the CPU's shared-memory file
    lent: bool = False  # the memory of a tensor the stream gathered into it (``IpcSender``)

    def drop(self) -> None:
        """The sender lets go (a receiver that mapped it keeps its pages)."""
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            self.path = None
        self.buffer = torch.empty(0, dtype=torch.uint8)


def shared_bucket(nbytes: int, device: torch.device) -> SharedBucket:
    """``nbytes`` of memory a colocated process can map with ``open_bucket``."""
    if device.type == "cpu":
        fd, path = tempfile.mkstemp(prefix="rlpost-weights-", dir=shm_dir())
        try:
            os.ftruncate(fd, max(nbytes, 1))
        finally:
            os.close(fd)
        buffer = torch.from_file(path, shared=True, size=max(nbytes, 1), dtype=torch.uint8)
        return SharedBucket(buffer[:nbytes], ("file", path, nbytes), path)
    buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return SharedBucket(buffer, ("ipc", ipc_handles(buffer)))


def open_bucket(handle: tuple) -> torch.Tensor:
    """The bytes of a ``SharedBucket``, mapped in this process without a copy."""
    kind = handle[0]
    if kind == "file":
        _, path, nbytes = handle
        if not os.path.exists(path):
            raise RuntimeError(
                f"weight sync (ipc): {path} is not on this machine: rollout.weight_sync=ipc "
                "needs the replica on the trainer's node (trainer.placement=colocated); "
                "use rollout.weight_sync=collective across nodes"
            )
        return torch.from_file(path, shared=True, size=max(nbytes, 1), dtype=torch.uint8)[:nbytes]
    if kind == "ipc":  # a CUDA-IPC handle
        return open_ipc(handle[1])
    raise ValueError(f"weight sync (ipc): unknown handle kind {kind!r}")


class NamedWeights(Protocol):
    """What ``IpcSender`` reads the weights from: rank 0 of a trainer engine (a
    ``rlpost.trainers.engine.WeightSource``). A ``weight_stream(empty)`` method, where
    the engine has one, is used instead of ``named_weights``."""

    def named_weights(self) -> list[tuple[str, torch.Tensor]] | None:
        """Every tensor under its checkpoint name (on rank 0)."""
        ...


class IpcSender:
    """Trainer rank 0's side of an ``ipc`` sync: ``plan``, then ``next()`` per
    bucket, each gathering the bucket's tensors as it fills (a sharded engine's
    gathers are collectives; the other ranks run theirs meanwhile, e.g.
    ``TrainerWorker.ipc_drive``), packing them and returning the bucket's handle.

    ``engine``: rank 0 of a trainer engine with ``weight_stream(empty)`` (specs and
    a lazy iterator) or ``named_weights()`` (the full list).

    On the CPU the stream gathers each tensor as large as a bucket or larger
    straight into a shared-memory file (``empty``), and that file is the tensor's
    bucket: such a tensor is never copied, so the sender's memory beyond its
    weights is one bucket plus the part being gathered, not a gathered tensor and
    its copy. A tensor the engine converts into new memory is packed as before."""

    def __init__(self, engine: NamedWeights, bucket_bytes: int, device: torch.device):
        if int(getattr(engine, "rank", 0)) != 0:
            raise RuntimeError("IpcSender runs on trainer rank 0")
        self.device, self.bucket_bytes = device, bucket_bytes
        # the files the stream was given to gather into and has not sent yet, by path:
        # a weak reference to the memory (the stream's to free), its address and size
        self.lent: dict[str, tuple[StorageWeakRef, int, int]] = {}
        stream = getattr(engine, "weight_stream", None)
        if stream is not None:
            specs, self.items = stream(self._empty) if device.type == "cpu" else stream()
        else:
            named = engine.named_weights()
            assert named is not None  # rank 0 has the full weights
            specs = [(n, tuple(t.shape), t.dtype) for n, t in named]
            self.items = iter(named)
        self.plan = plan_buckets(specs, bucket_bytes)
        self.index = 0
        self.held: list[SharedBucket] = []
        self.stats = SyncStats()

    def _empty(
        self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """Where the stream gathers a tensor: a shared-memory file if the tensor
        will have a bucket of its own (``plan_buckets``: as large as a bucket)."""
        nbytes = _nbytes(tuple(shape), dtype)
        if device.type != "cpu" or nbytes < self.bucket_bytes:
            return torch.empty(shape, dtype=dtype, device=device)
        bucket = shared_bucket(nbytes, device)
        assert bucket.path is not None
        tensor = bucket.buffer.view(dtype).view(shape)
        self.lent[bucket.path] = (
            StorageWeakRef(tensor.untyped_storage()),
            tensor.data_ptr(),
            nbytes,
        )
        return tensor

    def _unlink_freed(self) -> None:
        """Unlink the files whose memory the stream let go of unsent (it converted
        their tensor into new memory): a file's pages stay until it is unlinked."""
        for path, (ref, _, _) in list(self.lent.items()):
            if ref.expired():
                del self.lent[path]
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)

    def _as_is(
        self, slots: tuple[TensorSlot, ...], tensors: list[torch.Tensor]
    ) -> SharedBucket | None:
        """The file a one-tensor bucket's tensor was gathered into (``_empty``), or the
        held bucket that is that tensor already (a tied head sent after the embedding
        is the same tensor); None where the bucket has to be packed."""
        raw = bucket_as_is(slots, tensors, self.device)
        if raw is None:
            return None
        for bucket in self.held:
            same = bucket.buffer.data_ptr() == raw.data_ptr()
            if bucket.lent and same and bucket.buffer.numel() == raw.numel():
                return bucket
        storage = StorageWeakRef(raw.untyped_storage())
        for path, (ref, address, nbytes) in self.lent.items():
            if ref == storage and address == raw.data_ptr() and nbytes == raw.numel():
                del self.lent[path]
                return SharedBucket(raw, ("file", path, nbytes), path, lent=True)
        return None

    def _drop(self, keep: Callable[[SharedBucket], bool]) -> None:
        """Let go of the held buckets that ``keep(bucket)`` says no to."""
        kept = []
        for bucket in self.held:
            if keep(bucket):
                kept.append(bucket)
            else:
                self.stats.release(bucket.buffer.numel())
                bucket.drop()
        self.held = kept

    def next(self) -> tuple:
        """The next bucket's handle, its tensors gathered and packed."""
        if self.index >= len(self.plan.buckets):
            raise RuntimeError("weight sync (ipc): every bucket was sent already")
        slots, size = self.plan.buckets[self.index], self.plan.sizes[self.index]
        self.index += 1
        # The receiver asks for this bucket once done with the last: a bucket packed
        # here goes before the gathers, which may use its memory. One that is a
        # stream tensor's memory stays until the tensors are in: dropping it frees
        # nothing the stream still holds, and the stream may send it again.
        self._drop(keep=lambda b: b.lent)
        first = take(self.items, slots[:1])
        bucket = self._as_is(slots, first)
        self._drop(keep=lambda b: b is bucket)
        if bucket is None:
            bucket = shared_bucket(size, self.device)
            fill(bucket.buffer, slots, first, self.items, self.device)
            if self.device.type != "cpu":  # the copies are queued: done before the handle goes out
                devices.synchronize(self.device.type)
        del first
        self._unlink_freed()
        if not any(b is bucket for b in self.held):  # not the held bucket sent again
            self.held.append(bucket)
            self.stats.hold(size)
        self.stats.buckets += 1
        self.stats.bytes += size
        return bucket.handle

    def close(self) -> dict[str, int]:
        """Run what is left of the stream (its gathers pair with the other ranks'),
        drop the buckets; returns the figures."""
        for _ in self.items:
            pass
        self._drop(keep=lambda b: False)
        for path in self.lent:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self.lent.clear()
        return {
            "buckets": self.stats.buckets,
            "bytes": self.stats.bytes,
            "peak": self.stats.peak_bucket_bytes,
        }
