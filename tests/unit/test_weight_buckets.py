"""Weight buckets (``rlpost.runtime.weight_wire``): the layout by hand, and a round
trip through bytes that gives back every tensor exactly."""

from __future__ import annotations

import pytest
import torch

from rlpost.runtime.weight_wire import ALIGN, pack, plan_buckets, unpack


def test_layout_by_hand():
    # 10 floats = 40 B, then 3 bf16 = 6 B at offset 64 (aligned), then 100 floats = 400 B
    # which would end at 470 > 256: a new bucket; it is larger than a bucket: its own.
    specs = [
        ("a", (2, 5), torch.float32),
        ("b", (3,), torch.bfloat16),
        ("c", (100,), torch.float32),
        ("d", (4,), torch.int64),
    ]
    plan = plan_buckets(specs, bucket_bytes=256)
    assert [[s.name for s in b] for b in plan.buckets] == [["a", "b"], ["c"], ["d"]]
    assert [(s.offset, s.nbytes) for s in plan.buckets[0]] == [(0, 40), (ALIGN, 6)]
    assert plan.sizes == (70, 400, 32)
    assert plan.total_bytes == 502
    # the same specs give the same digest; another shape another one
    assert plan.digest == plan_buckets(specs, 256).digest
    assert plan.digest != plan_buckets([("a", (5, 2), torch.float32), *specs[1:]], 256).digest


def test_round_trip_is_exact_and_views_share_the_bucket():
    g = torch.Generator().manual_seed(0)
    tensors = {
        "w": torch.randn(7, 3, generator=g),
        "h": torch.randn(5, generator=g).to(torch.bfloat16),
        "i": torch.arange(6).reshape(2, 3),
        "m": torch.tensor([True, False, True]),
    }
    plan = plan_buckets([(n, tuple(t.shape), t.dtype) for n, t in tensors.items()], 1 << 20)
    assert len(plan.buckets) == 1
    buffer = torch.empty(plan.sizes[0], dtype=torch.uint8)
    pack(plan.buckets[0], list(tensors.values()), buffer)
    got = dict(unpack(plan.buckets[0], buffer))
    for name, t in tensors.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t), name
    buffer.zero_()  # views: the next bucket's bytes would overwrite them
    assert not got["w"].any()


def test_a_tensor_that_does_not_fit_its_slot_is_named():
    plan = plan_buckets([("w", (2, 2), torch.float32)], 1024)
    buffer = torch.empty(plan.sizes[0], dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"w: \(2, 3\) torch.float32 does not match"):
        pack(plan.buckets[0], [torch.zeros(2, 3)], buffer)
    with pytest.raises(ValueError, match="bucket_bytes=0"):
        plan_buckets([], 0)
    assert plan_buckets([], 64).buckets == ()
