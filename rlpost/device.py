"""Which device and collective backend a run uses (``trainer.device``). What
each kind of device means -- backend, Ray resource, visible-devices variable --
is decided in ``rlpost.runtime.device``, the floor every engine imports."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlpost.runtime import device as devices

BACKENDS = {name: k.backend for name, k in devices.KINDS.items()}


@dataclass(frozen=True)
class DeviceSpec:
    kind: str  # cpu, cuda or npu
    backend: str  # gloo, nccl or cpu:gloo,npu:hccl

    @property
    def ray_resource(self) -> dict[str, Any]:
        """Extra Ray options a worker on this device is made with."""
        return devices.ray_options(self.kind)


def npu_available() -> bool:
    return devices.is_available("npu")


def resolve_device(name: str) -> DeviceSpec:
    """``auto`` picks CUDA, then Ascend NPU, then CPU."""
    if name == "auto":
        name = devices.detect()
    if name in devices.ACCELERATORS and not devices.is_available(name):
        found = "no CUDA device is visible" if name == devices.CUDA else "torch_npu finds no NPU"
        raise RuntimeError(f"trainer.device={name} but {found}; use trainer.device=cpu")
    return DeviceSpec(kind=name, backend=devices.kind(name).backend)
