"""Everything that differs between devices, decided here and nowhere else.

A device kind is one of ``cpu``, ``cuda`` and ``npu`` (Ascend, through
``torch_npu``). For each kind this module knows the torch device type, the
process-group backend, the Ray resource a worker asks for, the variable that
lists the devices a process may see, and the memory, random-state and bf16
calls. Other modules ask here instead of naming a device: a test
(tests/unit/test_device_strings.py) fails on a CUDA call or a backend name
anywhere else in the packages.

The backends: ``gloo`` on the CPU; ``nccl`` on CUDA; on Ascend
``cpu:gloo,npu:hccl``, because HCCL reduces only device tensors and the engines
also gather small CPU tensors (object lists, counts) over the same group.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

CPU, CUDA, NPU = "cpu", "cuda", "npu"


@dataclass(frozen=True)
class DeviceKind:
    name: str  # torch's device type: cpu, cuda, npu
    backend: str  # torch.distributed backend (a device:backend map where it needs two)
    ray_resource: str | None  # the Ray resource one device is counted in
    visible_devices_env: str | None  # the variable listing the devices a process sees


KINDS = {
    CPU: DeviceKind(CPU, "gloo", None, None),
    CUDA: DeviceKind(CUDA, "nccl", "GPU", "CUDA_VISIBLE_DEVICES"),
    NPU: DeviceKind(NPU, "cpu:gloo,npu:hccl", "NPU", "ASCEND_RT_VISIBLE_DEVICES"),
}
ACCELERATORS = (CUDA, NPU)  # the order ``auto`` tries them in


def kind(name: str) -> DeviceKind:
    if name not in KINDS:
        raise ValueError(f"unknown device {name!r}; expected one of {', '.join(KINDS)}")
    return KINDS[name]


def torch_module(name: str) -> ModuleType | None:
    """``torch.cuda`` or ``torch.npu`` (the latter once ``torch_npu`` is imported);
    None for the CPU or where the module is missing."""
    if name == "cpu":
        return None
    if name == "npu":
        try:
            import torch_npu  # noqa: F401  (registers torch.npu)
        except ImportError:
            return None
    import torch

    return getattr(torch, name, None)


def is_available(name: str) -> bool:
    """Whether this process sees a device of kind ``name``."""
    if name == "cpu":
        return True
    module = torch_module(name)
    return bool(module is not None and module.is_available())


def detect() -> str:
    """The kind ``trainer.device=auto`` means here: CUDA, then Ascend, then the CPU."""
    return next((name for name in ACCELERATORS if is_available(name)), "cpu")


def in_use() -> list[str]:
    """The accelerator kinds this process has initialised (whose random state a
    checkpoint keeps)."""
    import torch

    out = []
    for name in ACCELERATORS:
        module = getattr(torch, name, None)  # torch.npu exists once torch_npu is imported
        if module is not None and module.is_available() and module.is_initialized():
            out.append(name)
    return out


def set_device(name: str, local_rank: int) -> None:
    """Bind this process to its device ``local_rank`` of those it sees."""
    module = torch_module(name)
    if module is not None:
        module.set_device(local_rank)


def visible_devices(name: str) -> list[str] | None:
    """The device ids this process may use, as Ray (or the user) listed them in the
    kind's variable; None where the variable is unset or the kind has none."""
    env = kind(name).visible_devices_env
    value = os.environ.get(env) if env else None
    if value is None:
        return None
    return [d for d in value.split(",") if d.strip()]


def ray_options(name: str, count: float = 1.0) -> dict[str, float | dict[str, float]]:
    """The options a Ray actor using ``count`` devices of kind ``name`` is made with."""
    resource = kind(name).ray_resource
    if resource is None:
        return {}
    if resource == "GPU":
        return {"num_gpus": count}
    return {"resources": {resource: count}}


def pin_memory() -> bool:
    """Whether host memory should be pinned for copies to an accelerator."""
    return any(is_available(name) for name in ACCELERATORS)


def synchronize(name: str) -> None:
    module = torch_module(name)
    if module is not None:
        module.synchronize()


def upload(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A host tensor (a batch's ids, masks, advantages) on ``device``, queued without
    waiting for the device. A blocking copy to an accelerator first waits for every
    kernel queued so far (``torch`` synchronises the stream after it), so that a
    micro-batch's tensors, copied as its loss needs them, would each stall the host
    until the forward pass had finished; from pageable memory the driver stages a
    non-blocking copy before returning, so the host tensor may change at once.
    On the CPU it is the tensor itself."""
    return tensor.to(device, non_blocking=True)


def empty_cache(name: str) -> None:
    module = torch_module(name)
    if module is not None:
        module.empty_cache()


def trim_host_heap(device_type: str) -> None:
    """Hand the memory freed inside the host's heap back to the OS (glibc's
    ``malloc_trim``) where tensors live on the host (``device_type`` "cpu");
    nothing on an accelerator or where the C library has none.

    glibc keeps what a freed tensor of a few MB leaves inside its heap (only
    larger ones are separate mappings, returned when freed), so a loop that
    gathers and frees a model's layers one after another grows the resident
    set by the heap's free space: 0.7-1.3x a 64 MB bucket at 150M parameters
    (bench/stream_memory.py). The weight stream calls this between parts.
    """
    trim = _malloc_trim() if device_type == "cpu" else None
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    return getattr(ctypes.CDLL(None), "malloc_trim", None)


def peak_memory_bytes(name: str) -> int | None:
    """The most memory tensors held on this process's device since the last reset;
    None on the CPU (measure the process's resident set there)."""
    module = torch_module(name)
    return None if module is None else int(module.max_memory_allocated())


def reset_peak_memory(name: str) -> None:
    module = torch_module(name)
    if module is not None:
        module.reset_peak_memory_stats()


def free_memory_bytes(name: str) -> tuple[int, int] | None:
    """(free, total) bytes of this process's device; None on the CPU."""
    module = torch_module(name)
    if module is None:
        return None
    free, total = module.mem_get_info()
    return int(free), int(total)


# The float32 workspace one chunked computation (``rlpost.trainers.logprobs``) may
# hold at once: two 16 MiB temporaries stay in a CPU's caches; an accelerator runs
# each chunk as a handful of kernels, which a chunk of a few dozen tokens at a 150k
# vocabulary leaves launch-bound, so its chunks are hundreds of tokens.
WORKSPACE_BYTES = {CPU: 32 << 20, CUDA: 1 << 30, NPU: 1 << 30}


def workspace_bytes(name: str) -> int:
    """``WORKSPACE_BYTES`` of device kind ``name``."""
    return WORKSPACE_BYTES[kind(name).name]


def fused_optimizer(name: str) -> bool:
    """Whether AdamW runs fused (one kernel over every tensor) on device kind ``name``:
    on CUDA; not on the CPU, where the built-in model's cached warm-ups were made with
    the per-tensor step, nor on Ascend, whose fused step torch does not provide."""
    return name == CUDA


def compile_problem(name: str) -> str | None:
    """Why ``torch.compile`` cannot build kernels for device kind ``name`` on this
    machine, or None: on the CPU its kernels are C++, built by ``$CXX`` (else g++;
    clang++ on macOS), the compiler torch's inductor looks for; on CUDA they are
    Triton's. Ascend's are its own backend's, not checked here."""
    if name == CPU:
        import shutil
        import sys

        cxx = os.environ.get("CXX") or ("clang++" if sys.platform == "darwin" else "g++")
        if shutil.which(cxx) is None:
            return (
                f"torch.compile builds its CPU kernels with a C++ compiler, and {cxx} was not "
                "found: install one (apt install g++) or point $CXX at one"
            )
    elif name == CUDA:
        from torch.utils._triton import has_triton

        if not has_triton():
            return "torch.compile builds its CUDA kernels with Triton, which is not installed"
    return None


def bf16_supported(name: str) -> bool:
    """Whether bf16 math runs natively: the CPU's oneDNN bf16 instructions, or the
    accelerator's own answer."""
    import torch

    if name == "cpu":
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    module = torch_module(name)
    return bool(module is not None and module.is_bf16_supported())


def rng_state() -> dict[str, torch.Tensor]:
    """The random state of torch's CPU generator and of each accelerator in use."""
    import torch

    state: dict[str, torch.Tensor] = {"torch": torch.get_rng_state()}
    for name in in_use():
        module = torch_module(name)
        assert module is not None
        state[name] = module.get_rng_state()
    return state


def set_rng_state(state: Mapping[str, torch.Tensor]) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    for name in ACCELERATORS:
        if name in state and is_available(name):
            module = torch_module(name)
            assert module is not None
            module.set_rng_state(state[name])


def current_device(name: str) -> torch.device:
    """This process's device of kind ``name`` as a ``torch.device``."""
    import torch

    module = torch_module(name)
    if module is None:
        return torch.device("cpu")
    return torch.device(name, module.current_device())


def collective_device(backend: str) -> torch.device:
    """The device whose tensors a process group with ``backend`` reduces: the CPU
    where gloo is among its backends (``gloo``, Ascend's ``cpu:gloo,npu:hccl``),
    else this process's accelerator (NCCL and HCCL take no CPU tensors)."""
    import torch

    parts = {part.split(":")[-1] for part in backend.lower().split(",")}
    if KINDS[CPU].backend in parts:
        return torch.device(CPU)
    if KINDS[CUDA].backend in parts:
        return current_device(CUDA)
    if "hccl" in parts:
        return current_device(NPU)
    raise ValueError(f"process-group backend {backend!r}: no device known for its collectives")


def weight_group_backend(device: torch.device | None) -> str:
    """The backend of a weight-transfer group between processes on ``device`` (a
    ``torch.device`` or None for the CPU): gloo on the CPU, NCCL on CUDA, HCCL on
    Ascend (its buckets are device tensors; ``torch_npu`` registers the backend)."""
    kind_name = getattr(device, "type", CPU)
    if kind_name == CUDA:
        return KINDS[CUDA].backend
    if kind_name == CPU:
        return KINDS[CPU].backend
    if kind_name == NPU:
        return "hccl"
    raise ValueError(f"no weight-transfer group for {kind_name} devices; use the object store")
