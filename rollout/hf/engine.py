"""A transformers ``generate`` engine behind the rollout interface.

The portable reference: it runs wherever transformers does (no vLLM, no
prefix cache), one request at a time. Its log-probs are of the processed
distribution (after temperature and top-p), like the vLLM engine's
``processed_logprobs``, so the trainer's recomputed log-probs match them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from rlpost.rollout.base import Completion, GenerationRequest, GenerationResult

if TYPE_CHECKING:
    from rlpost.runtime.hf_format import CheckpointLayout


@dataclass(frozen=True)
class HFEngineConfig:
    model_path: str
    dtype: str = "float32"
    max_model_len: int = 256
    seed: int = 0
    device: str = "cpu"


class HFEngine:
    def __init__(self, cfg: HFEngineConfig):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        start = time.perf_counter()
        self.cfg = cfg
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model_path)
        # Loosely typed: as transformers annotates it, ``to`` takes no device string and
        # ``generate`` is a module attribute (a tensor or a module), not a method.
        model: Any = AutoModelForCausalLM.from_pretrained(
            cfg.model_path, dtype=getattr(torch, cfg.dtype)
        )
        self.model = model.to(cfg.device)
        self.model.eval()
        self.eos_token_id = self.model.generation_config.eos_token_id
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else self.eos_token_id
        self._lock = asyncio.Lock()  # one generate or load at a time
        self._requests = 0
        self._weight_loads = 0
        self._layout: CheckpointLayout | None = None  # built on the first load_weights
        self.start_s = time.perf_counter() - start

    @torch.no_grad()
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return [self._generate_one(r) for r in requests]

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        async with self._lock:
            return await asyncio.to_thread(self._generate_one, request)

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load checkpoint-format weights; a sync that leaves a parameter (or part of
        one) unwritten is an error naming it."""
        from rlpost.runtime.hf_format import CheckpointLayout

        if self._layout is None:
            self._layout = CheckpointLayout(self.model)
        missing = self._layout.unwritten(self._layout.load(list(named_tensors)))
        if missing:
            raise ValueError(
                f"weight sync left {len(missing)} parameter(s) unwritten: {missing[:5]}"
            )
        self._weight_loads += 1

    async def aload_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        async with self._lock:
            self.load_weights(named_tensors)

    @torch.no_grad()
    def _generate_one(self, request: GenerationRequest) -> GenerationResult:
        from transformers import GenerationConfig

        s = request.sampling
        greedy = s.temperature == 0
        gen_cfg = GenerationConfig(
            do_sample=not greedy,
            temperature=None if greedy else s.temperature,
            top_p=None if greedy else s.top_p,
            top_k=None if greedy else 0,  # 0: no top-k (transformers would default to 50)
            max_new_tokens=min(s.max_tokens, self.cfg.max_model_len - len(request.prompt_ids)),
            min_new_tokens=min(s.min_tokens, s.max_tokens) or None,
            num_return_sequences=s.n,
            eos_token_id=self.eos_token_id,
            pad_token_id=self.pad_token_id,
            output_scores=True,
            return_dict_in_generate=True,
        )
        input_ids = torch.tensor([request.prompt_ids], device=self.cfg.device)
        with torch.random.fork_rng(devices=[]):
            if s.seed is not None:
                torch.manual_seed(s.seed)
            out = self.model.generate(
                input_ids, attention_mask=torch.ones_like(input_ids), generation_config=gen_cfg
            )
        # scores hold the processed logits of each step; normalised, the log-probs
        # of the distribution each token was drawn from.
        logp_bt = self.model.compute_transition_scores(
            out.sequences, out.scores, normalize_logits=True
        )
        new_bt = out.sequences[:, input_ids.shape[1] :]
        completions = []
        for ids_t, logp_t in zip(new_bt.tolist(), logp_bt.tolist()):
            finish = "length"
            if self.eos_token_id in ids_t:  # cut the padding after the end token
                ids_t = ids_t[: ids_t.index(self.eos_token_id) + 1]
                finish = "stop"
            completions.append(
                Completion(
                    token_ids=ids_t,
                    logprobs=logp_t[: len(ids_t)],
                    text=str(self.tokenizer.decode(ids_t, skip_special_tokens=True)),
                    finish_reason=finish,
                )
            )
        self._requests += 1
        return GenerationResult(prompt_ids=list(request.prompt_ids), completions=completions)

    def reset_prefix_cache(self) -> None:
        """Nothing to forget: this engine keeps no cache between requests."""

    def stats(self) -> dict[str, float]:
        return {
            "requests": float(self._requests),
            "weight_loads": float(self._weight_loads),
            "prefix_cache_queries": 0.0,
            "prefix_cache_hits": 0.0,
            "prefix_cache_hit_rate": 0.0,
        }
