"""``rollout.weight_sync=ipc`` on the CPU: trainer rank 0 packs buckets into
shared-memory files, a receiver maps them and reads the weights in place. Here the
receiver is another process, as the replica is."""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest
import torch
from rlpost.trainers.weight_sync import IpcSender, open_bucket, shared_bucket, unpack


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
        def weight_stream(self):
            specs = [(n, tuple(t.shape), t.dtype) for n, t in self.weights]
            return specs, iter(reversed(self.weights))

    sender = IpcSender(Reordered(WEIGHTS), bucket_bytes=64, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="got c where the plan has a"):
        sender.next()
    sender.close()


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
