"""A FAKE Ascend NPU, for tests on the CPU: enough of one for rlpost's device
selection, placement, visible devices and process-group set-up to run as they
would on Ascend -- and nothing more. Tensor math cannot run on it.

``install()`` renames PyTorch's PrivateUse1 backend to ``npu`` (what
``torch_npu`` does), registers a ``torch.npu`` module that answers the questions
``rlpost.runtime.device`` asks (available, device count from
``ASCEND_RT_VISIBLE_DEVICES``, set/current device), puts a stand-in ``torch_npu``
module in ``sys.modules``, and registers the ``hccl`` process-group backend name
with a creator that returns a gloo group and counts its calls."""

from __future__ import annotations

import os
import sys
import types

CREATED = {"hccl_groups": 0}


class FakeNpuModule(types.ModuleType):
    """The fake ``torch.npu``."""

    def __init__(self) -> None:
        super().__init__("torch.npu")
        self.device = 0

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return False  # no device state to checkpoint

    def device_count(self) -> int:
        listed = os.environ.get("ASCEND_RT_VISIBLE_DEVICES", "")
        return len([d for d in listed.split(",") if d.strip()])

    def set_device(self, index: int) -> None:
        if not 0 <= index < self.device_count():
            raise RuntimeError(f"fake npu: device {index} of {self.device_count()} visible")
        self.device = index

    def current_device(self) -> int:
        return self.device


def install() -> None:
    import torch
    import torch.distributed as dist

    if "torch_npu" in sys.modules:
        return
    torch.utils.rename_privateuse1_backend("npu")
    torch._register_device_module("npu", FakeNpuModule())
    sys.modules["torch_npu"] = types.ModuleType("torch_npu")

    def hccl_as_gloo(store, rank, size, timeout):  # type: ignore[no-untyped-def]
        CREATED["hccl_groups"] += 1
        return dist.ProcessGroupGloo(store, rank, size, timeout)

    dist.Backend.register_backend("hccl", hccl_as_gloo, devices=["npu"])
