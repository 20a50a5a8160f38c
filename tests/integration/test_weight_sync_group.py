"""The collective weight path between two real processes over gloo
(``rlpost.runtime.weight_wire.SyncGroup``): a model's weights arrive exactly,
in several buckets, with the layout sent once; neither side holds more than
one bucket; a receiver that dies mid-transfer makes the sender fail within the
group's timeout, and a group made again carries the next sync."""

from __future__ import annotations

import io
import socket
import time

import pytest
import torch
import torch.multiprocessing as mp

from rlpost.runtime.weight_wire import SyncGroup, SyncStats

BUCKET = 64 * 1024


def received(blob: bytes) -> dict[str, torch.Tensor]:
    return torch.load(io.BytesIO(blob))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(300, 64, generator=g),  # 75 KiB: a bucket of its own
        **{f"layers.{i}.q.weight": torch.randn(64, 64, generator=g) for i in range(4)},
        "norm.weight": torch.randn(64, generator=g).to(torch.bfloat16),
    }


def receiver(port: int, rounds: int, generation: int, out: mp.Queue, die_after: int) -> None:
    group = SyncGroup("127.0.0.1", port, 1, 2, timeout_s=20, generation=generation)
    for _ in range(rounds):
        stats = SyncStats()
        got = {}
        for name, tensor in group.receive(stats):
            got[name] = tensor.clone()  # a view of the bucket: copy before the next one
            if len(got) == die_after:
                import os

                os._exit(1)  # the replica dies mid-transfer
        blob = io.BytesIO()
        torch.save(got, blob)  # bytes: no tensor shared with a process about to exit
        out.put((blob.getvalue(), stats.buckets, stats.peak_bucket_bytes, group.plan.digest))


@pytest.fixture
def ctx():
    return mp.get_context("spawn")


def test_weights_arrive_exactly_in_buckets_with_the_layout_sent_once(ctx):
    port, out = free_port(), ctx.Queue()
    child = ctx.Process(target=receiver, args=(port, 2, 0, out, -1))
    child.start()
    group = SyncGroup("127.0.0.1", port, 0, 2, timeout_s=20)
    sent = []
    for seed in (0, 1):
        w = weights(seed)
        specs = [(n, tuple(t.shape), t.dtype) for n, t in w.items()]
        stats = group.send(iter(w.items()), BUCKET, specs)  # lazily, from an iterator
        blob, buckets, peak, digest = out.get(timeout=60)
        got = received(blob)
        sent.append((w, got))
        assert buckets == stats.buckets == len(group.plan.buckets) >= 3
        assert digest == group.plan.digest
        # one bucket at a time on both sides: the largest is the embedding's own
        assert peak == stats.peak_bucket_bytes == max(group.plan.sizes) == 300 * 64 * 4
    child.join(timeout=30)
    assert child.exitcode == 0
    for w, got in sent:
        assert list(got) == list(w)
        for name, t in w.items():
            assert got[name].dtype == t.dtype and torch.equal(got[name], t), name
    assert not torch.equal(sent[0][1]["norm.weight"], sent[1][1]["norm.weight"])


def test_a_receiver_dying_mid_transfer_fails_the_sender_and_a_new_group_works(ctx):
    port, out = free_port(), ctx.Queue()
    child = ctx.Process(target=receiver, args=(port, 1, 0, out, 2))
    child.start()
    group = SyncGroup("127.0.0.1", port, 0, 2, timeout_s=10)
    start = time.monotonic()
    with pytest.raises(RuntimeError):
        group.send(iter(weights(0).items()), BUCKET)
    assert time.monotonic() - start < 15
    child.join(timeout=30)
    assert child.exitcode == 1
    group.close()
    # Rebuilt (a fresh replica, a new generation of the group's keys): the sync goes on.
    port = free_port()
    child = ctx.Process(target=receiver, args=(port, 1, 1, out, -1))
    child.start()
    group = SyncGroup("127.0.0.1", port, 0, 2, timeout_s=20, generation=1)
    w = weights(2)
    group.send(iter(w.items()), BUCKET)
    got = received(out.get(timeout=60)[0])
    child.join(timeout=30)
    assert all(torch.equal(got[n], t) for n, t in w.items())


def hccl_member(rank: int, port: int, out: mp.Queue) -> None:
    """A process whose torch has a FAKE npu (its ``hccl`` makes gloo groups): rank 0
    sends ``weights(3)``, rank 1 receives them and reports them."""
    import fake_npu

    fake_npu.install()
    group = SyncGroup("127.0.0.1", port, rank, 2, backend="hccl", timeout_s=20)
    if rank == 0:
        group.send(iter(weights(3).items()), BUCKET)
        got: dict[str, torch.Tensor] = {}
    else:
        got = {name: tensor.clone() for name, tensor in group.receive()}
    blob = io.BytesIO()
    torch.save(got, blob)
    out.put((rank, blob.getvalue(), fake_npu.CREATED["hccl_groups"]))


def test_an_hccl_weight_group_is_made_by_the_backend_the_device_registered(ctx):
    """Ascend's weight group is whatever torch_npu registered as ``hccl``: here a
    FAKE npu's (installed only in the two child processes), which makes a gloo
    group over CPU tensors and counts that it was asked. What runs for real is the
    set-up path, not HCCL."""
    with pytest.raises(ValueError, match="'hccl' is not registered with torch.distributed"):
        SyncGroup("127.0.0.1", free_port(), 0, 1, backend="hccl", timeout_s=5)
    port, out = free_port(), ctx.Queue()
    members = [ctx.Process(target=hccl_member, args=(rank, port, out)) for rank in (0, 1)]
    for m in members:
        m.start()
    reports = dict(
        (rank, (blob, created)) for rank, blob, created in (out.get(timeout=60) for _ in members)
    )
    for m in members:
        m.join(timeout=30)
        assert m.exitcode == 0
    assert reports[0][1] == reports[1][1] == 1  # each made its group through the plugin
    got, w = received(reports[1][0]), weights(3)
    assert list(got) == list(w) and all(torch.equal(got[n], t) for n, t in w.items())
