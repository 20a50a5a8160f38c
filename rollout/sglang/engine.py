"""An SGLang offline engine (``sglang.Engine``) behind the rollout interface.

The engine runs in the process that builds it (a Ray actor, on the GPUs Ray
gave it) plus SGLang's own scheduler and detokenizer subprocesses. Requests
carry token ids (``input_ids``); each of the ``n`` samples of a request is its
own SGLang request with ``sampling_seed = seed + k``, so the prompt is computed
once and shared through SGLang's radix (prefix) cache.

Weights come from the trainer as ``(hf_name, tensor)`` pairs through
``update_weights_from_tensor`` (it flushes the prefix cache). For colocated
training, ``sleep``/``wake`` call ``release_memory_occupation`` /
``resume_memory_occupation`` (needs ``enable_memory_saver``).

Inside an asyncio actor the loop is already running, and the engine's
synchronous methods run ``loop.run_until_complete``; the async methods here
therefore await the tokenizer manager's coroutines with the same request
objects the synchronous methods build.

Targets ``sglang==0.5.23``; needs CUDA. Nothing here is imported without it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from rlpost.rollout.base import Completion, GenerationRequest, GenerationResult
from rlpost.runtime import device as devices

if TYPE_CHECKING:
    from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqInput


@dataclass(frozen=True)
class SGLangEngineConfig:
    model_path: str
    dtype: str = "auto"
    max_model_len: int = 4096
    mem_fraction_static: float = 0.5
    seed: int = 0
    tp_size: int = 1
    # release/resume memory between rollouts (colocated training); costs a little speed.
    enable_memory_saver: bool = True


def sampling_params(request: GenerationRequest, k: int) -> dict[str, int | float]:
    """SGLang sampling params for sample ``k`` of ``request`` (temperature 0 = greedy)."""
    s = request.sampling
    params: dict[str, int | float] = {
        "max_new_tokens": s.max_tokens,
        "min_new_tokens": min(s.min_tokens, s.max_tokens),
        "temperature": s.temperature,
        "top_p": s.top_p,
    }
    if s.seed is not None:
        params["sampling_seed"] = s.seed + k
    return params


def completion(out: dict[str, Any]) -> Completion:
    """One SGLang output (``return_logprob=True``), JSON as SGLang gives it, as a ``Completion``."""
    meta = out["meta_info"]
    # (logprob, token_id, text) per generated token: the sampled token's log-prob.
    pairs = meta["output_token_logprobs"]
    finish = meta["finish_reason"]
    kind = finish["type"] if isinstance(finish, dict) else str(finish)
    return Completion(
        token_ids=[int(p[1]) for p in pairs],
        logprobs=[float(p[0]) for p in pairs],
        text=out["text"],
        finish_reason="length" if kind == "length" else "stop",
    )


class SGLangEngine:
    """One SGLang replica: token ids, text and per-token sampling log-probs."""

    def __init__(self, cfg: SGLangEngineConfig):
        import sglang

        start = time.perf_counter()
        self.cfg = cfg
        self.engine = sglang.Engine(
            model_path=cfg.model_path,
            dtype=cfg.dtype,
            context_length=cfg.max_model_len,
            mem_fraction_static=cfg.mem_fraction_static,
            random_seed=cfg.seed,
            tp_size=cfg.tp_size,
            enable_memory_saver=cfg.enable_memory_saver,
            log_level="error",
        )
        self._open = asyncio.Event()  # cleared while weights load or memory is released
        self._open.set()
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._requests = 0
        self._weight_loads = 0
        self._prompt_tokens = 0
        self._cached_tokens = 0
        self.start_s = time.perf_counter() - start

    # -- generation ----------------------------------------------------------

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        await self._open.wait()
        self._in_flight += 1
        self._idle.clear()
        self._requests += 1
        try:
            outs = await asyncio.gather(
                *(
                    self.engine.async_generate(
                        input_ids=list(request.prompt_ids),
                        sampling_params=sampling_params(request, k),
                        return_logprob=True,
                    )
                    for k in range(request.sampling.n)
                )
            )
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()
        for out in outs:
            self._prompt_tokens += len(request.prompt_ids)
            self._cached_tokens += int(out["meta_info"].get("cached_tokens", 0))
        return GenerationResult(list(request.prompt_ids), [completion(o) for o in outs])

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Blocking batch (outside a running event loop only)."""
        return self.engine.loop.run_until_complete(
            asyncio.gather(*(self.agenerate(r) for r in requests))
        )

    # -- weights -------------------------------------------------------------

    def _weights_request(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> UpdateWeightsFromTensorReqInput:
        from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqInput
        from sglang.srt.utils import MultiprocessingSerializer

        device = devices.current_device(devices.CUDA)
        weights = [(name, t.detach().to(device).contiguous()) for name, t in named_tensors]
        return UpdateWeightsFromTensorReqInput(
            serialized_named_tensors=[
                MultiprocessingSerializer.serialize(weights) for _ in range(self.cfg.tp_size)
            ],
            load_format=None,
            flush_cache=True,  # cached prefixes were computed by the old weights
        )

    async def aload_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Pause new requests, let those in flight finish, load, resume."""
        self._open.clear()
        try:
            await self._idle.wait()
            tm = self.engine.tokenizer_manager
            result = await tm.update_weights_from_tensor(self._weights_request(named_tensors), None)
            _check(result, "update_weights_from_tensor")
            self._weight_loads += 1
        finally:
            self._open.set()

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        device = devices.current_device(devices.CUDA)
        weights = [(n, t.detach().to(device).contiguous()) for n, t in named_tensors]
        _check(self.engine.update_weights_from_tensor(weights, flush_cache=True), "load_weights")
        self._weight_loads += 1

    def reset_prefix_cache(self) -> None:
        self.engine.flush_cache()

    # -- memory (colocated training) ----------------------------------------

    async def asleep(self) -> None:
        """Free weights and KV cache on the GPU (the trainer runs meanwhile)."""
        from sglang.srt.managers.io_struct import ReleaseMemoryOccupationReqInput

        self._open.clear()
        await self._idle.wait()
        tm = self.engine.tokenizer_manager
        await tm.release_memory_occupation(ReleaseMemoryOccupationReqInput(), None)

    async def awake(self) -> None:
        from sglang.srt.managers.io_struct import ResumeMemoryOccupationReqInput

        tm = self.engine.tokenizer_manager
        await tm.resume_memory_occupation(ResumeMemoryOccupationReqInput(), None)
        self._open.set()

    def stats(self) -> dict[str, float]:
        q, h = self._prompt_tokens, self._cached_tokens
        return {
            "requests": float(self._requests),
            "weight_loads": float(self._weight_loads),
            "prefix_cache_queries": float(q),
            "prefix_cache_hits": float(h),
            "prefix_cache_hit_rate": h / q if q else 0.0,
        }

    def close(self) -> None:
        self.engine.shutdown()


def _check(result: object, what: str) -> None:
    """SGLang answers weight calls with (success, message) or an object with those."""
    ok, message = (
        (result[0], result[1])
        if isinstance(result, tuple)
        else (getattr(result, "success", True), getattr(result, "message", ""))
    )
    if not ok:
        raise RuntimeError(f"SGLang {what} failed: {message}")
