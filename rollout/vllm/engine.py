"""A vLLM engine behind the rollout interface, in-process, sync and async.

Built on vLLM V1's ``LLMEngine`` (``add_request`` / ``step``) run in this
process. ``generate`` steps the engine until a batch is done; ``agenerate``
adds one request and awaits it while a single asyncio task steps the engine,
so requests from many sessions arriving at different times share every
forward pass (continuous batching) and reuse each other's cached prefixes.

Why not ``vllm.v1.engine.async_llm.AsyncLLM``: in vLLM 0.32 it always runs
the engine core in a separate process (it refuses asyncio without
multiprocessing) and, on CPU, a further executor process; it took 19 s to
start the micro test model against 2 s in-process, and a Ray actor per
replica would carry two more processes on a two-core machine.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

import torch

from rlpost.rollout.base import (
    Completion,
    GenerationRequest,
    GenerationResult,
    IpcTensorSource,
    LoraAdapter,
    WeightLayout,
)
from rlpost.rollout.pd import clear_kv_store
from rlpost.rollout.vllm.config import ASCEND_ENV, VLLMEngineConfig, engine_args
from rlpost.rollout.vllm.outputs import (
    Interrupted,
    child_sampling,
    continuation,
    request_segments,
    to_result,
)
from rlpost.rollout.vllm.stats import PrefixCacheCounter, no_prometheus
from rlpost.runtime import device as devices

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest
    from vllm.outputs import RequestOutput


class VLLMEngine:
    """One vLLM replica: token ids, text and per-token sampling log-probs.

    Log-probs are of the processed distribution (after temperature), the one
    the trainer recomputes. Prefix caching is on; ``stats()`` reports its
    hit rate (cached prompt tokens / prompt tokens looked up).
    """

    def __init__(self, cfg: VLLMEngineConfig):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if cfg.device == "cpu":
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cfg.cpu_threads_bind
        if cfg.device == devices.NPU:
            for key, value in ASCEND_ENV.items():
                os.environ.setdefault(key, value)
        from transformers import PretrainedConfig

        from rlpost.runtime.hf_format import is_vision_language, placeholder_token_ids

        vision = is_vision_language(cfg.model_path)
        if vision:
            from rlpost.runtime.vl_compat import install

            install(vllm=True)  # vLLM's VL model modules import torchvision processors
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        # vLLM's model loader runs gc.collect() five times while the engine starts,
        # each a pass over every object the imports made (1.6 s of a 7 s start on
        # two cores). Frozen, those passes skip them (0.2 s); vLLM's engine core
        # freezes its heap the same way once it is up, and unfreezes at shutdown.
        gc.freeze()
        start = time.perf_counter()
        self.cfg = cfg
        # Images per prompt a vision-language model accepts (0: a text model).
        self._image_limit = cfg.max_images if vision else 0
        self._never_sample: dict[int, float] | None = None
        if self._image_limit:
            # vLLM's largest bias: p ~ e^-100 (the trainer masks the same tokens)
            config, _ = PretrainedConfig.get_config_dict(cfg.model_path)
            self._never_sample = {i: -100.0 for i in placeholder_token_ids(config)}
        self._cache = PrefixCacheCounter()
        self._lora_request: LoRARequest | None = None  # set by load_lora_adapter
        self._lora_dir: str | None = None
        self._lora_version = 0
        # Loosely typed: vLLM's stat logger factory returns its StatLoggerBase, which the
        # counter is by shape only (a subclass would import vLLM with its module).
        counter: Any = lambda vllm_config, engine_index=0: self._cache  # noqa: E731
        self.engine = LLMEngine.from_engine_args(
            EngineArgs(**engine_args(cfg, self._image_limit)),
            stat_loggers=[counter, no_prometheus()],
        )
        self.tokenizer = self.engine.get_tokenizer()
        self._ids = itertools.count()
        self._done: dict[str, RequestOutput] = {}  # finished outputs of sync requests
        self._waiting: dict[str, asyncio.Future[RequestOutput | Interrupted]] = {}  # async requests
        self._stepper: asyncio.Task | None = None
        self._open = asyncio.Event()  # cleared while weights load
        self._open.set()
        self._requests = 0
        self._weight_loads = 0
        self._interrupted = 0
        self._busy_s = 0.0  # seconds the async path had requests to step
        self._transfer_timeout_s = 120.0  # vLLM's weight transfer: set when its group opens
        # The policy version of the loaded weights, stamped on every sampled token.
        self.version = 0
        self.start_s = time.perf_counter() - start

    # -- sync path ---------------------------------------------------------

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Generate a batch and return results in input order (blocks)."""
        ids = [self._add(r) for r in requests]
        pending = set(ids)
        while pending:
            self._step()
            pending -= self._done.keys()
        return [to_result(r, self._done.pop(i), self.tokenizer) for r, i in zip(requests, ids)]

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new weights in place; call with no request in flight."""
        if self.engine.has_unfinished_requests():
            raise RuntimeError("load_weights with requests in flight; use aload_weights")
        weights = [(name, t.detach().to("cpu").contiguous()) for name, t in named_tensors]
        self.engine.collective_rpc("rlpost_load_weights", args=(weights,))
        self._weights_changed()

    # -- weights over a process group of their own (rollout.weight_sync=collective) --

    def open_weight_group(
        self, address: str, base_rank: int, world_size: int, generation: int, timeout_s: float
    ) -> None:
        """Join the weight group whose rank 0 (the trainer) listens at ``address``
        (``host:port``): each of this engine's workers as rank ``base_rank`` plus its
        own rank. Blocks until every member has joined. With ``weight_transfer`` set,
        the group is vLLM's own weight-transfer engine's (``rlpost.runtime.vllm_transfer``)."""
        if self.cfg.weight_transfer is not None:
            from rlpost.runtime.vllm_transfer import worker_init_info

            self._transfer_timeout_s = timeout_s
            info = worker_init_info(
                address, base_rank, world_size, self.cfg.weight_transfer_bucket_bytes
            )
            self.engine.collective_rpc("rlpost_open_vllm_transfer", args=(info,))
            return
        self.engine.collective_rpc(
            "rlpost_open_weight_group", args=(address, base_rank, world_size, generation, timeout_s)
        )

    def receive_weights(self, layout: WeightLayout | None = None) -> dict[str, int]:
        """Load the weights rank 0 sends, bucket by bucket; call with no request in
        flight. Returns the first worker's bucket counts. ``layout``: the names,
        dtypes and shapes sent, which vLLM's own weight transfer receives by (the
        trainer's ``open_weight_group`` gives it)."""
        if self.engine.has_unfinished_requests():
            raise RuntimeError("receive_weights with requests in flight; use areceive_weights")
        if self.cfg.weight_transfer is not None:
            if layout is None:
                raise ValueError("vLLM's weight transfer receives by a layout; none was given")
            stats = self.engine.collective_rpc(
                "rlpost_receive_weights_vllm",
                args=(layout, self._transfer_timeout_s, self.cfg.weight_transfer_bucket_bytes),
            )[0]
        else:
            stats = self.engine.collective_rpc("rlpost_receive_weights")[0]
        self._weights_changed()
        return stats

    def receive_weights_ipc(self, source: IpcTensorSource) -> dict[str, int]:
        """Load the buckets ``source`` maps one at a time (``rollout.weight_sync=ipc``:
        ``rlpost.workers.ipc_source.IpcSource``); call with no request in flight.
        Returns the worker's bucket counts."""
        if self.engine.has_unfinished_requests():
            raise RuntimeError("receive_weights_ipc with requests in flight; use the async form")
        stats = self.engine.collective_rpc("rlpost_receive_weights_ipc", args=(source,))[0]
        self._weights_changed()
        return stats

    async def areceive_weights_ipc(
        self, source: IpcTensorSource, version: int | None = None, interrupt: bool = False
    ) -> None:
        """``receive_weights_ipc`` between two engine steps, as ``aload_weights``."""
        await self._paused(
            lambda: self.receive_weights_ipc(source), version=version, interrupt=interrupt
        )

    async def areceive_weights(
        self,
        version: int | None = None,
        interrupt: bool = False,
        layout: WeightLayout | None = None,
    ) -> None:
        """``receive_weights`` between two engine steps, as ``aload_weights``."""
        await self._paused(
            lambda: self.receive_weights(layout), version=version, interrupt=interrupt
        )

    # -- memory, when the trainer shares the device (rollout.sleep) -------------

    async def asleep(self, level: int = 2) -> None:
        """Free the device memory between two generations: level 1 moves the
        weights to host memory and drops the KV cache, level 2 drops both (the next
        weight sync writes every weight). Needs ``sleep_mode`` in the config."""
        if not self.cfg.sleep_mode:
            raise RuntimeError("asleep() needs VLLMEngineConfig(sleep_mode=True)")
        self._open.clear()  # no request is admitted until it is fully awake
        while self._stepper is not None and not self._stepper.done():
            await asyncio.shield(self._stepper)
        self.engine.sleep(level=level)

    async def awake(self, tags: list[str] | None = None) -> None:
        """Take back ``tags`` (``weights``, ``kv_cache``; None: both). A sync goes
        between the two, so the KV cache is not held while the weights arrive;
        requests are admitted again once both are back."""
        if self.engine.wake_up(tags):
            self._open.set()

    def _weights_changed(self) -> None:
        """Forget what the old weights computed."""
        # Cached prefixes, and KV a connector stored, were computed by the old weights.
        self.engine.reset_prefix_cache()
        if self._image_limit:
            # So were image encodings. The reload cleared the model runner's caches;
            # the scheduler's and the input processor's must forget them too, or a
            # request finds an image "cached" that no longer is.
            self.engine.reset_encoder_cache()
            self.engine.reset_mm_cache()
        clear_kv_store(self.cfg.kv_transfer)
        self._weight_loads += 1

    def reset_prefix_cache(self) -> None:
        """Forget cached prefixes (the hit-rate counters keep their totals)."""
        if not self.engine.reset_prefix_cache():
            raise RuntimeError("prefix cache not reset: requests are in flight")

    # -- async path --------------------------------------------------------

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        """Generate one request, sharing forward passes with all others in flight.

        ``n`` samples go in as ``n`` requests of one sample, seeded ``seed + i``
        as vLLM seeds its own children (the same samples), so that each can be
        interrupted and continued on its own (``aload_weights(interrupt=True)``).
        """
        s = request.sampling
        if s.n == 1:
            return await self._agenerate_one(request)
        parts = await asyncio.gather(
            *(
                self._agenerate_one(replace(request, sampling=child_sampling(s, i)))
                for i in range(s.n)
            )
        )
        completions = [c for part in parts for c in part.completions]
        # the segments of the sample that finished last: the request waited for it
        last = max(parts, key=lambda r: max((end for _, _, end in r.segments), default=0.0))
        return GenerationResult(
            prompt_ids=parts[0].prompt_ids, completions=completions, segments=last.segments
        )

    async def _agenerate_one(self, request: GenerationRequest) -> GenerationResult:
        """One sample; interrupted by a weight load, it continues from its prompt and
        the tokens so far under the new weights (which recompute that prefix), so
        each token is sampled by one known version (``Completion.versions``)."""
        ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        segments: list[tuple[str, float, float]] = []
        stopped: float | None = None  # when a weight load interrupted it
        while True:
            await self._open.wait()
            if stopped is not None:
                segments.append(("interrupted", stopped, time.time()))
            part = continuation(request, ids, segment=len(set(versions)))
            version = self.version
            rid = self._add(part)
            future = asyncio.get_running_loop().create_future()
            self._waiting[rid] = future
            if self._stepper is None or self._stepper.done():
                self._stepper = asyncio.create_task(self._step_loop())
            try:
                out = await future
            except asyncio.CancelledError:  # the caller gave up on it (a run's end)
                if self._waiting.pop(rid, None) is not None:
                    self.engine.abort_request([rid])
                raise
            if isinstance(out, Interrupted):
                ids += out.token_ids
                logprobs += out.logprobs
                versions += [version] * len(out.token_ids)
                stopped = time.time()
                continue
            result = to_result(part, out, self.tokenizer)
            result.segments = segments + request_segments(out)
            if not ids:
                result.completions[0].versions = [version] * len(result.completions[0].token_ids)
                return result
            c = result.completions[0]
            all_ids = ids + c.token_ids
            ended = c.finish_reason == "stop"
            text = self.tokenizer.decode(all_ids, skip_special_tokens=True)
            full = Completion(
                token_ids=all_ids,
                logprobs=logprobs + c.logprobs,
                text=text,
                finish_reason="stop" if ended else "length",
                versions=versions + [version] * len(c.token_ids),
            )
            prompt = result.prompt_ids[: len(result.prompt_ids) - len(ids)]
            return GenerationResult(prompt_ids=prompt, completions=[full], segments=result.segments)

    async def aload_weights(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        version: int | None = None,
        interrupt: bool = False,
    ) -> None:
        """Pause new requests, let those in flight finish (``interrupt``: stop them
        where they are; each continues under the new weights), load, resume.
        ``version``: the policy version the new weights are (default: one more)."""
        await self._paused(
            lambda: self.load_weights(named_tensors), version=version, interrupt=interrupt
        )

    async def aload_lora_adapter(
        self, adapter: LoraAdapter, version: int | None = None, interrupt: bool = False
    ) -> None:
        """Pause new requests, let those in flight finish (or interrupt them), swap
        the adapter, resume."""
        await self._paused(
            lambda: self.load_lora_adapter(adapter), version=version, interrupt=interrupt
        )

    async def _paused(
        self, change: Callable[[], object], version: int | None = None, interrupt: bool = False
    ) -> None:
        """Run ``change`` with no request in flight and none admitted meanwhile."""
        self._open.clear()
        try:
            if interrupt:
                self._interrupt_all()
            while self._stepper is not None and not self._stepper.done():
                await asyncio.shield(self._stepper)
            change()
            self.version = self.version + 1 if version is None else version
        finally:
            self._open.set()

    def _interrupt_all(self) -> None:
        """Stop every async request between two engine steps (no forward pass is
        running: this runs on the loop that steps the engine) and hand each its
        tokens and log-probs so far."""
        states = self.engine.output_processor.request_states
        external = self.engine.output_processor.external_req_ids
        for rid, future in list(self._waiting.items()):
            ids: list[int] = []
            lps: list[float] = []
            for internal in external.get(rid, []):
                state = states.get(internal)
                if state is None or state.detokenizer is None:
                    continue
                ids = list(state.detokenizer.output_token_ids)
                steps = state.logprobs_processor.logprobs if state.logprobs_processor else None
                lps = [step[t].logprob for step, t in zip(steps or [], ids) if step]
            lps = lps[: len(ids)]
            ids = ids[: len(lps)]  # a token without its log-prob is sampled again
            self.engine.abort_request([rid])
            del self._waiting[rid]
            if not future.done():
                future.set_result(Interrupted(ids, lps))
            self._interrupted += 1

    async def _step_loop(self) -> None:
        start = time.perf_counter()
        try:
            while self._waiting:
                self._step()
                # Let newly arrived requests join before the next step.
                await asyncio.sleep(0)
        except Exception as e:  # hand the engine's error to every waiting request
            for future in self._waiting.values():
                if not future.done():
                    future.set_exception(e)
            self._waiting.clear()
            raise
        finally:
            self._busy_s += time.perf_counter() - start

    # -- shared ------------------------------------------------------------

    def _add(self, request: GenerationRequest) -> str:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        s = request.sampling
        params = SamplingParams(
            n=s.n,
            temperature=s.temperature,
            top_p=s.top_p,
            max_tokens=s.max_tokens,
            min_tokens=min(s.min_tokens, s.max_tokens),
            seed=s.seed,
            logprobs=0,
            # Text is decoded once per completion in to_result: vLLM's incremental
            # detokenizer also decodes every sampled log-prob's token, which cost
            # ~15 % of a short-completion batch on the CPU.
            detokenize=False,
            logit_bias=self._never_sample,
            # One output per request, holding all n samples, once every sample is done.
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        rid = str(next(self._ids))
        prompt = TokensPrompt(prompt_token_ids=request.prompt_ids)
        if request.images:
            if not self._image_limit:
                raise ValueError(f"{self.cfg.model_path} is not a vision-language model: no images")
            prompt["multi_modal_data"] = {"image": request.images}
        self.engine.add_request(rid, prompt, params, lora_request=self._lora_request)
        self._requests += 1
        return rid

    def _step(self) -> None:
        for step_out in self.engine.step():
            # A generating model's outputs (a pooling model's are the other kind vLLM types).
            out = cast("RequestOutput", step_out)
            if not out.finished:
                continue
            future = self._waiting.pop(out.request_id, None)
            if future is None:
                self._done[out.request_id] = out
            elif not future.done():
                future.set_result(out)

    # -- LoRA adapter sync (rollout.lora_sync=adapter) ---------------------------
    def load_lora_adapter(self, adapter: LoraAdapter) -> None:
        """Serve every later request with this LoRA adapter on top of the base weights.

        ``adapter`` is a PEFT adapter directory, or ``(tensors, adapter_config)`` as
        ``FSDPEngine.adapter_weights()`` returns them (written to a private temp dir,
        since vLLM loads adapters from disk). Each call replaces the previous adapter;
        ``None`` goes back to the base weights alone.
        """
        import json
        import tempfile

        from vllm.lora.request import LoRARequest

        if not self.cfg.lora:
            raise ValueError("load_lora_adapter needs VLLMEngineConfig(lora=RANK > 0)")
        if adapter is None:
            self._lora_request = None
            self.engine.reset_prefix_cache()
            clear_kv_store(self.cfg.kv_transfer)
            return
        if isinstance(adapter, str):
            path = adapter
        else:
            from safetensors.torch import save_file

            tensors, config = adapter
            if self._lora_dir is None:
                self._lora_dir = tempfile.mkdtemp(prefix="rlpost-lora-")
            path = os.path.join(self._lora_dir, f"v{self._lora_version + 1}")
            os.makedirs(path)
            save_file(
                {k: v.detach().cpu().contiguous() for k, v in tensors.items()},
                os.path.join(path, "adapter_model.safetensors"),
            )
            with open(os.path.join(path, "adapter_config.json"), "w") as f:
                json.dump(config, f)
        self._lora_version += 1
        # A new name and id per version: vLLM caches adapters by id.
        self._lora_request = LoRARequest(f"policy-v{self._lora_version}", self._lora_version, path)
        self.engine.reset_prefix_cache()
        clear_kv_store(self.cfg.kv_transfer)
        self._weight_loads += 1

    def stats(self) -> dict[str, float]:
        queries, hits = self._cache.queries, self._cache.hits
        out = {
            "requests": float(self._requests),
            "weight_loads": float(self._weight_loads),
            "interrupted": float(self._interrupted),
            "busy_s": self._busy_s,
            "prefix_cache_queries": float(queries),
            "prefix_cache_hits": float(hits),
            "prefix_cache_hit_rate": hits / queries if queries else 0.0,
            # (async.max_inflight=auto steers by these two: rlpost.loop.concurrency)
            "preemptions": float(self._cache.preemptions),
            "kv_cache_usage_peak": self._cache.take_peak(),  # since the last stats()
        }
        if self.cfg.kv_transfer is not None:
            # Prompt tokens whose KV came through the connector (decode side).
            out["kv_transfer_queries"] = float(self._cache.kv_queries)
            out["kv_transfer_hits"] = float(self._cache.kv_hits)
        return out
