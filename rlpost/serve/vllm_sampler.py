"""``rlpost serve --sampler vllm``: the tenants' sampler snapshots served by one vLLM
engine over the base model, each snapshot a LoRA adapter of its own.

vLLM keeps ``SAMPLER_SLOTS`` adapters in the batch at once and twice as many in
host memory, evicting the least recently used; a snapshot is written once as a
PEFT adapter folder (``STATE_DIR/sampler/<key>``) and loaded from there whenever
vLLM needs it again. The engine runs in the server's process on a thread of its
own: the sampling requests of every tenant that arrive while it generates join
its batch, and training goes on beside it on the model host's worker thread.

Log-probs are of the sampled token under softmax(logits / temperature) (vLLM's
``processed_logprobs``), the distribution the trainer's ``forward_backward``
scores; with top-k or top-p they are of the distribution cut to those tokens.
"""

from __future__ import annotations

import itertools
import os
import queue
import shutil
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rlpost.serve.errors import UserError
from rlpost.serve.wire import SampledOut, SampleParams
from rlpost.trainers.fsdp.lora import save_adapter

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest


MAX_RANK = 64  # the largest tenant rank the engine allocates room for
KV_CACHE_GIB = 0.25  # the engine's KV cache on the CPU


class VLLMSampler:
    def __init__(self, path: str, max_len: int, device: str, folder: Path, slots: int):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        args: dict[str, Any] = dict(
            model=path, dtype="float32", max_model_len=max_len, seed=0,
            enable_prefix_caching=True, logprobs_mode="processed_logprobs",
            enable_lora=True, max_loras=slots, max_cpu_loras=2 * slots, max_lora_rank=MAX_RANK,
            disable_log_stats=True, use_tqdm_on_load=False,
        )  # fmt: skip
        if device == "cpu":
            args.update(kv_cache_memory_bytes=int(KV_CACHE_GIB * 2**30),
                        enable_chunked_prefill=False,
                        max_num_batched_tokens=max(max_len, 4096))  # fmt: skip
        self.engine = LLMEngine.from_engine_args(EngineArgs(**args))
        self.folder = folder
        self._ids = itertools.count(1)
        self._requests: dict[str, LoRARequest] = {}  # snapshot key -> its adapter
        self._seq = itertools.count()
        # sampling jobs, and adapters to unload, for the engine's thread
        self._jobs: queue.SimpleQueue[_Job | LoRARequest] = queue.SimpleQueue()
        threading.Thread(target=self._loop, daemon=True, name="serve-vllm").start()

    # -- adapters ------------------------------------------------------------
    def adapter(
        self, key: str, tensors: dict[str, torch.Tensor], rank: int, config: dict
    ) -> LoRARequest:
        """The snapshot ``key`` as a vLLM adapter: ``tensors`` named and ``config`` as
        PEFT saves them, written as an adapter folder the first time it is asked for."""
        if key in self._requests:
            return self._requests[key]
        from vllm.lora.request import LoRARequest

        if rank > MAX_RANK:
            raise UserError(f"LoRA rank {rank}: the vLLM sampler serves ranks up to "
                            f"{MAX_RANK} (rlpost serve --sampler model serves any)")  # fmt: skip
        where = self.folder / key.replace(":", "_").replace("/", "_")
        shutil.rmtree(where, ignore_errors=True)
        save_adapter(where, tensors, config)
        request = LoRARequest(key, next(self._ids), str(where))
        self._requests[key] = request
        return request

    def drop(self, key: str) -> None:
        """Forget snapshot ``key``'s adapter (the engine's thread unloads it)."""
        request = self._requests.pop(key, None)
        if request is not None:
            self._jobs.put(request)

    # -- sampling ------------------------------------------------------------
    def submit(
        self,
        prompt: list[int],
        n: int,
        params: SampleParams,
        max_tokens: int,
        prompt_logprobs: bool,
        lora: LoRARequest | None,
    ) -> Future[tuple[list[SampledOut], list[float] | None]]:
        """``n`` samples of ``prompt``, generated in the engine's next batches."""
        from vllm import SamplingParams

        # One request a sample (vLLM takes n > 1 only when sampling at random): the
        # i-th seeded seed + i, so the n differ and a seed gives the same n again.
        job = _Job(prompt, prompt_logprobs, lora)
        for i in range(n):
            job.params.append(SamplingParams(
                n=1, max_tokens=max_tokens, temperature=max(params.temperature, 0.0),
                top_k=params.top_k if params.top_k > 0 else 0, top_p=params.top_p,
                stop=list(params.stop_strings) or None, stop_token_ids=list(params.stop_tokens),
                seed=None if params.seed is None else (params.seed + i) % (1 << 62),
                logprobs=0, prompt_logprobs=0 if prompt_logprobs and i == 0 else None,
                detokenize=bool(params.stop_strings), include_stop_str_in_output=True,
            ))  # fmt: skip
        self._jobs.put(job)
        return job.future

    def sample(self, *args: Any) -> tuple[list[SampledOut], list[float] | None]:
        """``submit``, waited for."""
        return self.submit(*args).result()

    def _loop(self) -> None:
        """The engine's thread: takes new jobs, steps while any request is unfinished,
        and answers each job once its last sample is done."""
        from vllm.inputs import TokensPrompt

        owners: dict[str, _Job] = {}
        while True:
            busy = self.engine.has_unfinished_requests()
            items: list[_Job | LoRARequest] = []
            try:  # wait for work only when nothing is generating
                items.append(self._jobs.get(block=not busy))
                while True:
                    items.append(self._jobs.get_nowait())
            except queue.Empty:
                pass
            for item in items:
                if not isinstance(item, _Job):  # an adapter to drop
                    self.engine.remove_lora(item.lora_int_id)
                    shutil.rmtree(item.lora_path, ignore_errors=True)
                    continue
                try:
                    for sampling in item.params:
                        rid = f"s{next(self._seq)}"
                        item.rids.append(rid)
                        owners[rid] = item
                        self.engine.add_request(rid, TokensPrompt(prompt_token_ids=item.prompt),
                                                sampling, lora_request=item.lora)  # fmt: skip
                except Exception as exc:  # a request vLLM refuses fails its own job only
                    self._fail(item, owners, exc)
            if not self.engine.has_unfinished_requests():
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:  # every job in the batch has failed
                for job in set(owners.values()):
                    self._fail(job, owners, exc)
                continue
            for out in outputs:
                owner: _Job | None = owners.pop(out.request_id, None) if out.finished else None
                if owner is not None:
                    owner.done[out.request_id] = out
                    if len(owner.done) == len(owner.rids) and not owner.future.done():
                        owner.future.set_result(_answer(owner))

    def _fail(self, job: _Job, owners: dict[str, _Job], exc: Exception) -> None:
        for rid in job.rids:
            if owners.pop(rid, None) is not None and rid not in job.done:
                self.engine.abort_request([rid])
        if not job.future.done():
            job.future.set_exception(exc)


@dataclass(eq=False)  # one job is one, however its fields compare
class _Job:
    prompt: list[int]
    prompt_logprobs: bool
    lora: LoRARequest | None
    params: list[Any] = field(default_factory=list)  # vLLM's SamplingParams, one a sample
    rids: list[str] = field(default_factory=list)
    done: dict[str, Any] = field(default_factory=dict)  # request id -> its RequestOutput
    future: Future = field(default_factory=Future)


def _answer(job: _Job) -> tuple[list[SampledOut], list[float] | None]:
    sequences = []
    for rid in job.rids:
        c = job.done[rid].outputs[0]
        tokens = list(c.token_ids)
        assert c.logprobs is not None  # asked for with logprobs=0
        lps = [float(step[t].logprob) for t, step in zip(tokens, c.logprobs, strict=True)]
        sequences.append(SampledOut(tokens, lps, c.finish_reason == "stop"))
    first = None
    if job.prompt_logprobs:
        prompt, out = job.prompt, job.done[job.rids[0]]
        assert out.prompt_logprobs is not None
        first = [float("nan")] + [
            float(step[t].logprob) if step is not None else float("nan")
            for t, step in zip(prompt[1:], out.prompt_logprobs[1:], strict=True)
        ]
    return sequences, first
