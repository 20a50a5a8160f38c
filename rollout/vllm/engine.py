"""A vLLM engine behind the rollout interface (runs in-process on CPU)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from rollout.base import Completion, GenerationRequest, GenerationResult


@dataclass(frozen=True)
class VLLMEngineConfig:
    model_path: str
    dtype: str = "float32"
    max_model_len: int = 256
    kv_cache_gib: float = 1.0
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = True
    seed: int = 0
    device: str = "cpu"


class VLLMEngine:
    """Wraps ``vllm.LLM``; returns token ids, text and per-token sampling log-probs."""

    def __init__(self, cfg: VLLMEngineConfig):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        start = time.perf_counter()
        self.cfg = cfg
        kwargs: dict[str, Any] = dict(
            model=cfg.model_path,
            dtype=cfg.dtype,
            max_model_len=cfg.max_model_len,
            enforce_eager=cfg.enforce_eager,
            seed=cfg.seed,
            enable_prefix_caching=True,
            # Log-probs after temperature, as the trainer computes them.
            logprobs_mode="processed_logprobs",
            worker_extension_cls="rollout.vllm.worker_ext.WeightSyncExtension",
        )
        if cfg.device == "cpu":
            kwargs["kv_cache_memory_bytes"] = int(cfg.kv_cache_gib * 2**30)
        else:
            kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
        self.llm = LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self._requests = 0
        self._weight_loads = 0
        self.start_s = time.perf_counter() - start

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=r.prompt_ids) for r in requests]
        params = [
            SamplingParams(
                n=r.sampling.n,
                temperature=r.sampling.temperature,
                top_p=r.sampling.top_p,
                max_tokens=r.sampling.max_tokens,
                seed=r.sampling.seed,
                logprobs=0,
            )
            for r in requests
        ]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        self._requests += len(requests)
        results = []
        for req, out in zip(requests, outputs):
            completions = []
            for c in out.outputs:
                ids = list(c.token_ids)
                # logprobs=0 returns the sampled token's log-prob at every position.
                lps = [step[tok].logprob for step, tok in zip(c.logprobs or [], ids) if step]
                completions.append(
                    Completion(
                        token_ids=ids,
                        logprobs=lps,
                        text=c.text,
                        finish_reason="length" if c.finish_reason == "length" else "stop",
                    )
                )
            results.append(
                GenerationResult(prompt_ids=list(req.prompt_ids), completions=completions)
            )
        return results

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        weights = [(name, t.detach().to("cpu").contiguous()) for name, t in named_tensors]
        self.llm.collective_rpc("rlpost_load_weights", args=(weights,))
        # Cached prefixes were computed by the old weights.
        self.llm.reset_prefix_cache()
        self._weight_loads += 1

    def stats(self) -> dict[str, float]:
        return {"requests": float(self._requests), "weight_loads": float(self._weight_loads)}
