"""The process group every engine rank joins, and a gather into memory its caller gives."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from rlpost.trainers import device as devices


def init_distributed(
    device: str, backend: str, rank: int, world_size: int, init_method: str
) -> torch.device:
    """Join the process group (once per process) and return this rank's device."""
    devices.set_device(device, int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)
    return torch.device(device)


Empty = Callable[[tuple[int, ...], torch.dtype, torch.device], torch.Tensor]


def new_tensor(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Where a gather puts a full tensor unless its caller says (``Empty``)."""
    return torch.empty(shape, dtype=dtype, device=device)


def gather_into(views: list[list[torch.Tensor]], mine: list[torch.Tensor], group: Any) -> None:
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
            dist.broadcast(buffer, src=src, group=group)
            if buffer is not view and r != me:
                view.copy_(buffer)
