"""Ray shell around one rollout engine (a replica).

An asyncio actor: every ``generate`` / ``generate_one`` call awaits the
engine's ``agenerate``, so calls from several callers (or one caller's
concurrent calls) are served by the same running batch.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections import deque
from typing import TYPE_CHECKING

import torch

from rlpost.rollout.base import (
    AdapterLoader,
    GenerationRequest,
    GenerationResult,
    GroupReceiver,
    IpcReceiver,
    Sleeper,
    Versioned,
)
from rlpost.runtime.spans import RECORDER, Event
from rlpost.workers.ray_types import ActorHandle

if TYPE_CHECKING:
    from rlpost.runtime.weight_wire import BucketPlan

# What the replicas load: full weights as (name, tensor) pairs, and a LoRA adapter
# as its tensors and its peft config (``PolicyEngine.named_weights``,
# ``adapter_weights``). Ray hands an actor the values of the object-store
# references it is called with.
NamedTensors = list[tuple[str, torch.Tensor]]
Adapter = tuple[dict[str, torch.Tensor], dict[str, object]]


def prompt_hash(prompt_ids: list[int]) -> str:
    """A short stable digest of a prompt's token ids."""
    data = b"".join(i.to_bytes(4, "little") for i in prompt_ids)
    return hashlib.blake2b(data, digest_size=8).hexdigest()


class RolloutWorker:
    # Most recent requests remembered for ``served()``.
    SERVED_LOG = 100_000

    def __init__(self, engine_cfg: object, threads: int, engine: str = "vllm"):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        # vLLM's per-reload INFO/WARNING lines drown the progress bar.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        # In a Ray worker vLLM's records reach the worker's own root handler too.
        logging.getLogger("vllm").setLevel(logging.ERROR)
        torch.set_num_threads(threads)
        from rlpost.rollout.registry import build_engine

        self.engine = build_engine(engine, engine_cfg)
        # what this engine can do beyond generating and loading weights (rollout.base)
        e = self.engine
        self.versioned = e if isinstance(e, Versioned) else None
        self.group_receiver = e if isinstance(e, GroupReceiver) else None
        self.ipc_receiver = e if isinstance(e, IpcReceiver) else None
        self.adapter_loader = e if isinstance(e, AdapterLoader) else None
        self.sleeper = e if isinstance(e, Sleeper) else None
        # The policy version of the loaded weights, for engines that do not stamp
        # their tokens themselves (vLLM does, exactly, through interruptions).
        self.version = 0
        self._served: deque[tuple[str | None, str]] = deque(maxlen=self.SERVED_LOG)

    def ready(self) -> bool:
        return True

    def pid(self) -> int:
        """This replica's process id (fault-injection tests kill it)."""
        return os.getpid()

    async def resync(
        self, weights: NamedTensors | None, adapter: Adapter | None, version: int = 0
    ) -> None:
        """Catch a restarted replica up: the group's last weights, then its last
        LoRA adapter (either None when none was ever sent), as policy ``version``."""
        if weights is not None:
            await self.load_weights(weights, version)
        if adapter is not None:
            await self.load_lora_adapter(adapter, version)

    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return list(await asyncio.gather(*(self.generate_one(r) for r in requests)))

    async def generate_one(self, request: GenerationRequest) -> GenerationResult:
        self._served.append((request.session_id, prompt_hash(request.prompt_ids)))
        version = self.version
        if not RECORDER.on():
            result = await self.engine.agenerate(request)
        else:
            result = await self._traced(request)
        for c in result.completions:
            if c.versions is None:  # an engine that drains before a load
                c.versions = [version] * len(c.token_ids)
        return result

    async def _traced(self, request: GenerationRequest) -> GenerationResult:
        """``agenerate`` as a span on a row of its own, with the engine's segments
        (queued, prefill, decode, interrupted) where it reports them."""
        row, start = RECORDER.take_row(), time.time()
        try:
            result = await self.engine.agenerate(request)
        finally:
            RECORDER.free_row(row)
        end = time.time()
        tokens = sum(len(c.token_ids) for c in result.completions)
        RECORDER.add("request", start, end, cat="rollout", row=row, version=self.version,
                     prompt_tokens=len(request.prompt_ids), tokens=tokens,
                     session=request.session_id)  # fmt: skip
        for name, s0, s1 in getattr(result, "segments", None) or []:
            RECORDER.add(name, max(s0, start), min(s1, end), cat="segment", row=row)
        return result

    def trace_events(self, level: str, lane: str) -> list[Event]:
        """This replica's spans since the last call (``rlpost.loop.timeline``),
        recorded at ``level`` from now on under the name ``lane``."""
        RECORDER.configure(level, lane)
        return RECORDER.drain()

    async def generate_after(
        self, request: GenerationRequest, prefilled: GenerationResult
    ) -> GenerationResult:
        """PD's decode half: ``prefilled`` is the prefill call's ObjectRef, which Ray
        resolves before this runs, so the prompt's KV is in the connector by now."""
        del prefilled  # only the ordering matters
        return await self.generate_one(request)

    async def load_weights(
        self, named_tensors: NamedTensors, version: int | None = None, interrupt: bool = False
    ) -> float:
        """Seconds until the new weights (policy ``version``) are in, including
        waiting for requests in flight; ``interrupt``: stop those where they are
        and continue them under the new weights (engines that can, i.e. vLLM)."""
        start = time.perf_counter()
        version = self.version + 1 if version is None else version
        if self.versioned is not None:
            await self.versioned.aload_weights(named_tensors, version=version, interrupt=interrupt)
        else:
            await self.engine.aload_weights(named_tensors)
        self.version = version
        return self._loaded("load_weights", start, version)

    async def open_weight_group(
        self, address: str, base_rank: int, world_size: int, generation: int, timeout_s: float
    ) -> int:
        """Join the trainer's weight group (``rollout.weight_sync=collective``) as rank
        ``base_rank`` (and up, one per engine worker); returns how many ranks it took."""
        self._group_receiver().open_weight_group(
            address.removeprefix("tcp://"), base_rank, world_size, generation, timeout_s
        )
        return 1

    def _loaded(self, name: str, start: float, version: int) -> float:
        """Seconds since ``start`` (``perf_counter``), recorded as the load's span."""
        seconds = time.perf_counter() - start
        now = time.time()
        RECORDER.add(name, now - seconds, now, cat="sync", version=version)
        return seconds

    def _group_receiver(self) -> GroupReceiver:
        if self.group_receiver is None:
            raise ValueError(
                f"{type(self.engine).__name__} cannot receive weights over a process group; "
                "use rollout.weight_sync=object_store"
            )
        return self.group_receiver

    async def receive_weights(
        self,
        version: int | None = None,
        interrupt: bool = False,
        layout: dict[str, list] | None = None,
    ) -> float:
        """Seconds until the weights rank 0 of the weight group sends are in, as
        ``load_weights`` (``version``, ``interrupt``). ``layout``: what is sent, where
        the group is vLLM's own weight transfer (``rlpost.runtime.vllm_transfer``)."""
        start = time.perf_counter()
        version = self.version + 1 if version is None else version
        await self._group_receiver().areceive_weights(
            version=version, interrupt=interrupt, layout=layout
        )
        self.version = version
        return self._loaded("receive_weights", start, version)

    async def receive_weights_ipc(
        self,
        sender: ActorHandle,
        plan: BucketPlan,
        version: int | None = None,
        interrupt: bool = False,
    ) -> float:
        """Seconds until the weights trainer rank 0 (``sender``) hands out as memory
        this process maps are in (``rollout.weight_sync=ipc``; ``plan``: their
        buckets), as ``load_weights`` (``version``, ``interrupt``)."""
        from rlpost.workers.ipc_source import IpcSource

        if self.ipc_receiver is None:
            raise ValueError(
                f"{type(self.engine).__name__} cannot map weights a trainer hands out; "
                "use rollout.weight_sync=object_store"
            )
        start = time.perf_counter()
        version = self.version + 1 if version is None else version
        await self.ipc_receiver.areceive_weights_ipc(
            IpcSource(sender, plan), version=version, interrupt=interrupt
        )
        self.version = version
        return self._loaded("receive_weights_ipc", start, version)

    async def load_lora_adapter(
        self, adapter: Adapter, version: int | None = None, interrupt: bool = False
    ) -> float:
        """Seconds to swap in a new LoRA adapter, after the requests in flight finish
        (``interrupt``: as ``load_weights``)."""
        start = time.perf_counter()
        if self.adapter_loader is None:
            raise ValueError(
                "rollout.lora_sync=adapter needs an engine with LoRA (rollout.name=vllm)"
            )
        version = self.version + 1 if version is None else version
        await self.adapter_loader.aload_lora_adapter(adapter, version=version, interrupt=interrupt)
        self.version = version
        return self._loaded("load_lora_adapter", start, version)

    async def sleep(self, level: int | None = None) -> None:
        """Free the engine's GPU memory for colocated training (engines with
        ``asleep``); ``level`` (vLLM): 1 keeps the weights in host memory, 2 drops them."""
        sleeper = self._sleeper()
        await (sleeper.asleep() if level is None else sleeper.asleep(level))

    async def wake(self, tags: list[str] | None = None) -> None:
        """Take the memory back; ``tags`` (vLLM): ``["weights"]`` or ``["kv_cache"]``
        alone, so that a weight sync can run between the two."""
        sleeper = self._sleeper()
        await (sleeper.awake() if tags is None else sleeper.awake(tags))

    def _sleeper(self) -> Sleeper:
        if self.sleeper is None:
            raise ValueError(
                f"{type(self.engine).__name__} cannot release its memory; set rollout.sleep=off"
            )
        return self.sleeper

    def stats(self) -> dict[str, float]:
        return self.engine.stats()

    def reset_prefix_cache(self) -> None:
        self.engine.reset_prefix_cache()

    def served(self) -> list[tuple[str | None, str]]:
        """``(session_id, prompt_hash)`` of each request received, oldest first."""
        return list(self._served)
