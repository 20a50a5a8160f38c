"""Let megatron-core 0.16 run on the CPU with the gloo backend.

megatron-core assumes CUDA throughout. With its local (non-Transformer-Engine)
layer spec, unfused kernels, torch's own optimizers (no Apex) and gloo process
groups, everything it computes runs on the CPU as well; what stops it is how it
names and places tensors. Each patch below removes one such assumption, and
they are applied only when torch has no CUDA (``apply`` does nothing on a GPU
machine, and ``on_cpu`` is then an empty context):

1. ``torch.cuda.current_device()`` returns the CPU device. megatron passes it
   as ``device=`` wherever it allocates (buffers, rotary tables, gradient
   buckets), so those tensors land on the CPU.
2. ``torch.cuda.synchronize()`` does nothing: CPU ops are synchronous.
3. ``on_cpu()``, a torch function mode entered around every engine call,
   rewrites ``device="cuda"`` to the CPU (megatron writes it literally in the
   optimizer, the gradient clipping and the pipeline schedules), makes
   ``tensor.cuda()`` return the tensor, and reports ``tensor.type()`` with its
   CUDA name (``torch.cuda.FloatTensor``), which is how megatron's optimizers
   check parameter dtypes; ``pin_memory=True`` (context parallelism's rotary
   table) becomes False. It is a mode rather than a global patch so that it
   acts only inside the engine's calls and on the calling thread.
4. The RNG tracker (named states that megatron forks around dropout so tensor-
   parallel ranks draw different masks, and around recomputation) keeps CPU
   generator states instead of CUDA ones.
5. ``torch.cuda.Stream`` is a CPU stand-in class whose waits and events do
   nothing, ``torch.cuda.current_stream()`` returns one and
   ``torch.cuda.stream(s)`` is an empty context. MoE's all-to-all token
   dispatcher copies its split sizes to the host on a side stream and waits on
   an event; CPU ops are synchronous, so there is nothing to wait for.
   Its host copies (``maybe_move_tensor_to_cpu``) turn the split sizes into
   numpy arrays only when they start on the GPU; on the CPU they do so here
   too, since ``all_to_all_single`` takes lists of ints, not tensors.
6. megatron-core 0.16.1's MoE router asks ``te_general_gemm is not None``, a
   name its module defines only when Transformer Engine imports (a NameError
   without it); set to None, the router takes its torch matmul path.

Nothing here changes numerics: the same ops run, on the CPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from functools import wraps
from typing import ParamSpec, TypeVar

import torch
from torch.overrides import TorchFunctionMode

_applied = False
P = ParamSpec("P")
R = TypeVar("R")


def cpu_only() -> bool:
    return not torch.cuda.is_available()


class _CudaNamesOnCpu(TorchFunctionMode):
    """Patch 3: CUDA placements become CPU ones; CPU tensors answer to CUDA type names."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            return func(*args).replace("torch.", "torch.cuda.", 1)
        device = kwargs.get("device")
        if device is not None and "cuda" in str(device):
            kwargs["device"] = "cpu"
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False  # pinned memory needs an accelerator
        return func(*args, **kwargs)


@contextlib.contextmanager
def on_cpu() -> Iterator[None]:
    """The context every megatron call runs in (empty where CUDA is present)."""
    if not cpu_only():
        yield
        return
    with _CudaNamesOnCpu():
        yield


def runs_on_cpu(method: Callable[P, R]) -> Callable[P, R]:
    """Decorator: run ``method`` inside ``on_cpu()``."""

    @wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with on_cpu():
            return method(*args, **kwargs)

    return wrapper


class _CpuStream:
    """Patch 5: a CUDA stream (and its events) on the CPU, where every op is synchronous."""

    def __init__(self, *args: object, **kwargs: object):
        pass

    def wait_stream(self, stream: object) -> None:
        pass

    def wait_event(self, event: object) -> None:
        pass

    def record_event(self, event: object = None) -> _CpuStream:
        return self  # the event: its synchronize() returns at once

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


def apply() -> None:
    """Install patches 1, 2, 4, 5 and 6 (once per process; nothing when CUDA is present)."""
    global _applied
    if _applied or not cpu_only():
        return
    _applied = True
    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment,return-value]
    torch.cuda.synchronize = lambda *args, **kwargs: None  # type: ignore[assignment]
    torch.cuda.Stream = _CpuStream  # type: ignore[assignment,misc]
    torch.cuda.current_stream = lambda *args, **kwargs: _CpuStream()  # type: ignore[assignment,return-value]
    torch.cuda.stream = lambda *args, **kwargs: contextlib.nullcontext()  # type: ignore[assignment,return-value]

    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None  # type: ignore[attr-defined]

    from megatron.core.transformer.moe import token_dispatcher

    def to_host(tensor: object, as_numpy: bool = False, record_stream: bool = False) -> object:
        if as_numpy and torch.is_tensor(tensor):
            return tensor.numpy()
        return tensor

    token_dispatcher.maybe_move_tensor_to_cpu = to_host  # type: ignore[assignment]

    from megatron.core.tensor_parallel import random as mrandom

    class CpuRngTracker(mrandom.CudaRNGStatesTracker):
        """Patch 4: named states of the CPU generator."""

        def add(self, name: str, seed: int) -> None:
            if seed in self.seeds_ or name in self.states_:
                raise ValueError(f"RNG state {name!r} or seed {seed} already added")
            self._is_initialized = True
            self.seeds_.add(seed)
            self.states_[name] = torch.Generator().manual_seed(seed).get_state()

        @contextlib.contextmanager
        def fork(self, name: str = mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME) -> Iterator[None]:
            if name not in self.states_:
                raise KeyError(f"RNG state {name!r} was never added")
            outer = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(outer)

    mrandom._CUDA_RNG_STATE_TRACKER = CpuRngTracker()
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    # activation recomputation saves and restores "the CUDA state" through these two
    mrandom._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *args, **kwargs: torch.set_rng_state(state)
