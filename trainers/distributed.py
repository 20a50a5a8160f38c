"""The process group every engine rank joins, and the collectives the engines call.

Every tensor handed to a collective lives on its process group's device: NCCL
(CUDA) and HCCL (Ascend) take no CPU tensors, gloo takes CPU tensors. A
collective that passes on the CPU under gloo can crash on the first GPU step,
so the engines call the collectives here, which move a tensor to the group's
device and back, and nowhere else (tests/unit/test_collective_devices.py reads
every ``torch.distributed`` call in the packages).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import torch.distributed as dist

from rlpost.runtime import device as devices


def init_distributed(
    device: str, backend: str, rank: int, world_size: int, init_method: str
) -> torch.device:
    """Join the process group (once per process) and return this rank's device."""
    devices.set_device(device, int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)
    return torch.device(device)


def group_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """The device ``group``'s collectives take their tensors on (``devices.collective_device``)."""
    return devices.collective_device(str(dist.get_backend(group)))


def _on(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    return tensor if tensor.device == device else tensor.to(device)


def all_reduce_(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Sum ``tensor`` over ``group``'s ranks, in place, wherever it lives (a CPU
    tensor goes through the group's device and comes back). Returns ``tensor``."""
    moved = _on(tensor, group_device(group))
    dist.all_reduce(moved, group=group)
    if moved is not tensor:
        tensor.copy_(moved)
    return tensor


def broadcast_(
    tensor: torch.Tensor, src: int, group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """``tensor`` as global rank ``src`` has it, on every rank of ``group``, in place
    wherever it lives. ``tensor`` must be contiguous. Returns ``tensor``."""
    moved = _on(tensor, group_device(group))
    dist.broadcast(moved, src=src, group=group)
    if moved is not tensor:
        tensor.copy_(moved)
    return tensor


def all_gather(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> list[torch.Tensor]:
    """Every rank's ``x`` (same shape on each), in rank order, on the group's device."""
    x = _on(x, group_device(group)).contiguous()  # gloo writes into the buffers as given
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x, group=group)
    return parts


Empty = Callable[[tuple[int, ...], torch.dtype, torch.device], torch.Tensor]


def new_tensor(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Where a gather puts a full tensor unless its caller says (``Empty``)."""
    return torch.empty(shape, dtype=dtype, device=device)


def gather_into(
    views: list[list[torch.Tensor]], mine: list[torch.Tensor], group: dist.ProcessGroup | None
) -> None:
    """All-gather into memory the caller owns: ``views[r]`` are where rank ``r``'s
    pieces go (the same views' shapes on every rank of ``group``), ``mine`` this rank's
    pieces in that order.

    Each piece is broadcast from its rank straight into its view. ``all_gather`` into
    a list of views would not do: gloo gathers into a flat buffer of its own and copies
    out of it, a second copy of the whole tensor at once. A view that is not contiguous
    (a tensor split along columns) receives through a buffer of one piece's size.
    """
    group = group if group is not None else dist.group.WORLD
    me = dist.get_rank(group)
    assert group is not None  # WORLD, once the process group is joined (get_rank checked)
    for r, targets in enumerate(views):
        src = dist.get_global_rank(group, r)
        for i, view in enumerate(targets):
            if view.numel() == 0:
                continue
            if r == me:
                view.copy_(mine[i])
            buffer = view  # the broadcast writes into it in place
            if not view.is_contiguous():
                buffer = mine[i].contiguous() if r == me else view.new_empty(view.shape)
            broadcast_(buffer, src, group)
            if buffer is not view and r != me:
                view.copy_(buffer)
