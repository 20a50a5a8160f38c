"""The process group every engine rank joins."""

from __future__ import annotations

import os

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
