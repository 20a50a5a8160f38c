"""Which device and collective backend a process uses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}


@dataclass(frozen=True)
class DeviceSpec:
    kind: str  # cpu, cuda or npu
    backend: str  # gloo, nccl or hccl

    @property
    def ray_resource(self) -> dict[str, Any]:
        """Extra Ray resources a worker on this device asks for."""
        if self.kind == "cuda":
            return {"num_gpus": 1}
        if self.kind == "npu":
            return {"resources": {"NPU": 1}}
        return {}


def npu_available() -> bool:
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        return False
    import torch

    return bool(torch.npu.is_available())  # type: ignore[attr-defined]


def resolve_device(name: str) -> DeviceSpec:
    """``auto`` picks CUDA, then Ascend NPU, then CPU."""
    import torch

    if name == "auto":
        if torch.cuda.is_available():
            name = "cuda"
        elif npu_available():
            name = "npu"
        else:
            name = "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "trainer.device=cuda but no CUDA device is visible; use trainer.device=cpu"
        )
    if name == "npu" and not npu_available():
        raise RuntimeError("trainer.device=npu but torch_npu finds no NPU; use trainer.device=cpu")
    return DeviceSpec(kind=name, backend=BACKENDS[name])
