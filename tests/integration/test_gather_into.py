"""Gathers into one tensor the caller gives (``rlpost.trainers.distributed.gather_into``),
two ranks over gloo: the weight stream's full tensors are exactly the shards joined,
and they are the memory the caller allocated, with no second copy made on the way
(gloo's ``all_gather`` gathers into a buffer of its own and copies out of it).

Legend: r = rows, c = columns."""

from __future__ import annotations

import io

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from ports import free_port

from rlpost.trainers.distributed import gather_into
from rlpost.trainers.megatron.convert import (
    tp_full_shape,
    tp_merge,
    tp_pieces,
    tp_split,
    tp_views,
)

# Megatron names of each tensor-parallel layout (``convert.tp_layout``)
NAMES = {
    "col": "embedding.word_embeddings.weight",
    "row": "decoder.layers.0.self_attention.linear_proj.weight",
    "glu": "decoder.layers.0.mlp.linear_fc1.weight",
}


def _full_rc(rows: int, cols: int) -> torch.Tensor:
    # element (i, j) = 100 i + j: a misplaced row or column shows in the values
    return (torch.arange(rows)[:, None] * 100 + torch.arange(cols)[None, :]).float()


def _megatron(rank: int, out: dict) -> None:
    """Each layout's full tensor gathered from the ranks' ``tp_split`` shards."""
    for layout, name in NAMES.items():
        full_rc = _full_rc(8, 6)
        shard = tp_split(name, full_rc, 2)[rank]
        given = torch.empty(tp_full_shape(name, tuple(shard.shape), 2))
        gather_into(tp_views(name, given, 2), tp_pieces(name, shard), None)
        out[layout] = (given, tp_merge(name, tp_split(name, full_rc, 2)))


def _fsdp(rank: int, out: dict) -> None:
    """FSDP2-sharded parameters (torch.chunk along dim 0, empty shards at the end)
    made whole into the memory ``empty`` gives."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from rlpost.trainers.fsdp.engine import _whole

    mesh = init_device_mesh("cpu", (2,))
    for rows in (5, 1):  # shards of 3 and 2 rows; of 1 row and none
        full_rc = _full_rc(rows, 4)
        given: list[torch.Tensor] = []

        def empty(shape, dtype, device, given=given):
            given.append(torch.empty(shape, dtype=dtype, device=device))
            return given[-1]

        dtensor = distribute_tensor(full_rc, mesh, [Shard(0)])
        whole = _whole(dtensor, empty)
        out[f"fsdp{rows}"] = (whole, full_rc, len(given), whole.data_ptr() == given[0].data_ptr())


def _worker(rank: int, port: int, queue: mp.Queue) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    out: dict = {}
    _megatron(rank, out)
    _fsdp(rank, out)
    blob = io.BytesIO()
    torch.save(out, blob)  # bytes: no tensor shared with a process about to exit
    queue.put((rank, blob.getvalue()))
    dist.barrier()
    dist.destroy_process_group()


def test_every_rank_gets_the_shards_joined_in_the_memory_it_gave():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = {r: torch.load(io.BytesIO(b)) for r, b in (queue.get(timeout=120) for _ in procs)}
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for rank, out in results.items():
        for layout in NAMES:
            given, merged = out[layout]
            # tp_merge of the shards is the full (8, 6) tensor: col and glu split rows
            # (4 + 4), row splits columns (3 + 3) and goes through a 3-column buffer
            assert torch.equal(given, merged), (rank, layout)
            assert torch.equal(given, _full_rc(8, 6)), (rank, layout)
        for rows in (5, 1):
            whole, full_rc, allocations, same = out[f"fsdp{rows}"]
            assert torch.equal(whole, full_rc), (rank, rows)
            # one allocation, and the result is that memory: no copy after the gather
            assert allocations == 1 and same, (rank, rows)
