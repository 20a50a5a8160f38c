"""``rollout.weight_sync=ipc`` on the CPU: trainer rank 0 packs buckets into
shared-memory files, a receiver maps them and reads the weights in place. Here the
receiver is another process, as the replica is."""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest
import torch

from rlpost.runtime.weight_wire import (
    IpcSender,
    bucket_as_is,
    open_bucket,
    pack,
    plan_buckets,
    shared_bucket,
    unpack,
)
from rlpost.trainers.distributed import new_tensor


class ListEngine:
    """A stand-in for a trainer engine's rank 0: ``named_weights`` only."""

    rank = 0

    def __init__(self, weights: list[tuple[str, torch.Tensor]]):
        self.weights = weights

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        return self.weights


WEIGHTS = [
    ("a", torch.arange(12, dtype=torch.float32).reshape(3, 4)),  # 48 bytes
    ("b", torch.tensor([1, 2, 3], dtype=torch.int64)),  # 24 bytes
    ("c", torch.full((16,), 0.5, dtype=torch.bfloat16)),  # 32 bytes
]


def _read(handles_and_slots, out):
    """In a child process: map each bucket and send back its tensors' sums."""
    sums = {}
    for handle, slots in handles_and_slots:
        for name, tensor in unpack(slots, open_bucket(handle)):
            sums[name] = float(tensor.float().sum())
    out.put(sums)


def test_buckets_are_mapped_by_another_process_and_the_sender_holds_one():
    sender = IpcSender(ListEngine(WEIGHTS), bucket_bytes=64, device=torch.device("cpu"))
    # 64-byte buckets, offsets 64-aligned: a (48) alone, then b (24) alone (b + c is
    # 64 + 32 with b's padding), then c
    assert [[s.name for s in b] for b in sender.plan.buckets] == [["a"], ["b"], ["c"]]
    handles = []
    for slots in sender.plan.buckets:
        handles.append((sender.next(), slots))
        assert len(sender.held) == 1  # the last bucket only
    paths = [h[1] for h, _ in handles]
    assert sum(os.path.exists(p) for p in paths) == 1  # earlier files are unlinked
    # a receiver that had mapped them before could still read them; here only the
    # last is mapped after the fact, in another process
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=_read, args=(handles[-1:], out))
    child.start()
    sums = out.get(timeout=60)
    child.join(timeout=60)
    assert sums == {"c": 8.0}
    stats = sender.close()
    assert stats == {"buckets": 3, "bytes": 48 + 24 + 32, "peak": 48}
    assert not any(os.path.exists(p) for p in paths)
    with pytest.raises(RuntimeError, match="every bucket was sent"):
        sender.next()


def test_a_mapped_bucket_outlives_the_senders_drop():
    bucket = shared_bucket(8, torch.device("cpu"))
    bucket.buffer.copy_(torch.arange(8, dtype=torch.uint8))
    mapped = open_bucket(bucket.handle)
    bucket.drop()
    assert not os.path.exists(bucket.handle[1])
    assert mapped.tolist() == list(range(8))
    with pytest.raises(RuntimeError, match="needs the replica on the trainer's node"):
        open_bucket(bucket.handle)


def test_a_name_out_of_order_is_refused():
    class Reordered(ListEngine):
        def weight_stream(self, empty=None):
            specs = [(n, tuple(t.shape), t.dtype) for n, t in self.weights]
            return specs, iter(reversed(self.weights))

    sender = IpcSender(Reordered(WEIGHTS), bucket_bytes=64, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="got c where the plan has a"):
        sender.next()
    sender.close()


class GatheringEngine(ListEngine):
    """A sharded engine's rank 0 in small: ``weight_stream(empty)`` "gathers" each
    tensor into memory from ``empty`` (here a copy of the whole), and ``convert``
    stands for a conversion into new memory."""

    def __init__(self, weights, convert=lambda t: t):
        super().__init__(weights)
        self.convert, self.given = convert, []

    def weight_stream(self, empty=new_tensor):
        specs = [(n, tuple(t.shape), t.dtype) for n, t in self.weights]

        def items():
            gathered = {}  # a tensor sent twice (a tied head) is gathered once
            for name, t in self.weights:
                if id(t) not in gathered:
                    full = empty(tuple(t.shape), t.dtype, t.device)
                    full.copy_(t)
                    self.given.append(full.data_ptr())
                    gathered = {id(t): self.convert(full)}
                    del full
                yield name, gathered[id(t)]

        return specs, items()


def _rlpost_files() -> set[str]:
    from rlpost.runtime.weight_wire import shm_dir

    return {f for f in os.listdir(shm_dir()) if f.startswith("rlpost-weights-")}


def test_a_tensor_with_a_bucket_of_its_own_is_gathered_into_it_and_never_copied():
    embed = torch.arange(40, dtype=torch.float32)  # 160 bytes >= a 64-byte bucket
    # the embedding, the tied head (the embedding's tensor, as Megatron sends it), the rest
    weights = [("embed", embed), ("head", embed), *WEIGHTS]
    engine = GatheringEngine(weights)
    before = _rlpost_files()
    sender = IpcSender(engine, bucket_bytes=64, device=torch.device("cpu"))
    assert [[s.name for s in b] for b in sender.plan.buckets] == [
        ["embed"],
        ["head"],
        ["a"],
        ["b"],
        ["c"],
    ]
    handles = [sender.next()]
    # the embedding's bucket is the file the stream gathered it into: no copy
    [held] = sender.held
    assert held.buffer.data_ptr() == engine.given[0] and held.handle == handles[0]
    handles.append(sender.next())
    # the head is the embedding's tensor, gathered once: sent from the same file
    assert handles[1] == handles[0]
    assert [held.buffer.data_ptr() for held in sender.held] == [engine.given[0]]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=_read, args=([(handles[1], sender.plan.buckets[1])], out))
    child.start()
    assert out.get(timeout=60) == {"head": 780.0}  # 0 + 1 + ... + 39 = 39 * 40 / 2
    child.join(timeout=60)
    for _ in range(3):
        sender.next()
    stats = sender.close()
    # one bucket held at a time, the largest 160 bytes; sent: 160 + 160 + 48 + 24 + 32
    assert stats == {"buckets": 5, "bytes": 424, "peak": 160}
    assert _rlpost_files() <= before  # every file unlinked


def test_a_file_whose_tensor_is_converted_into_new_memory_is_unlinked_and_packed():
    big = torch.arange(40, dtype=torch.float32)
    engine = GatheringEngine([("big", big), *WEIGHTS], convert=lambda t: t * 2)
    before = _rlpost_files()
    sender = IpcSender(engine, bucket_bytes=64, device=torch.device("cpu"))
    handle = sender.next()
    # the conversion's result was packed into a bucket of the sender's, and the file
    # the stream gathered into went as soon as the stream let go of its tensor
    assert not sender.held[0].lent and len(sender.lent) == 0
    assert _rlpost_files() - before == {os.path.basename(handle[1])}
    assert unpack(sender.plan.buckets[0], open_bucket(handle))[0][1].sum() == 1560.0  # 2 * 780
    for _ in range(3):
        sender.next()
    sender.close()
    assert _rlpost_files() <= before


def test_a_one_tensor_bucket_is_the_tensors_own_bytes():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    plan = plan_buckets([("t", (2, 3), torch.float32), ("u", (3, 2), torch.float32)], 16)
    [slot_t], [slot_u] = plan.buckets  # 24 bytes each > 16: a bucket each
    raw = bucket_as_is((slot_t,), [t], torch.device("cpu"))
    assert raw is not None and raw.data_ptr() == t.data_ptr() and raw.numel() == 24
    packed = torch.empty(24, dtype=torch.uint8)
    pack((slot_t,), [t], packed)
    assert torch.equal(raw, packed)  # the bytes pack would copy
    # a transposed view is not contiguous: packed as before
    assert bucket_as_is((slot_u,), [t.t()], torch.device("cpu")) is None
    with pytest.raises(ValueError, match=r"u: \(2, 3\) torch.float32 does not match"):
        bucket_as_is((slot_u,), [t], torch.device("cpu"))


@pytest.mark.gpu
def test_cuda_buckets_are_mapped_by_another_process():
    # The GPU form of the hand-off: CUDA-IPC handles of buckets on the trainer's device.
    device = torch.device("cuda", 0)
    weights = [(n, t.to(device)) for n, t in WEIGHTS]
    sender = IpcSender(ListEngine(weights), bucket_bytes=1 << 20, device=device)
    [slots] = sender.plan.buckets  # everything fits one bucket
    handle = sender.next()
    assert handle[0] == "ipc"
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=_read, args=([(handle, slots)], out))
    child.start()
    sums = out.get(timeout=120)
    child.join(timeout=120)
    assert sums == {"a": 66.0, "b": 6.0, "c": 8.0}
    sender.close()
