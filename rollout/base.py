"""What every rollout engine takes and returns.

An engine is any object with ``generate``, ``load_weights``, ``stats`` (see
``RolloutEngine``); the async form (``AsyncRolloutEngine``) adds
``agenerate`` for one request and ``aload_weights``, which a Ray actor in
``rlpost/workers`` awaits so requests from many callers interleave.

What only some engines can do is a capability protocol of its own
(``Versioned``, ``GroupReceiver``, ``IpcReceiver``, ``AdapterLoader``,
``Sleeper``): the replica's shell checks which ones its engine has once, when it
builds it, and refuses a call the engine cannot take with a message naming the
setting to change.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from PIL.Image import Image

    from rlpost.rollout.agent.loop import Episode
    from rlpost.runtime.weight_wire import SyncStats

# A LoRA adapter as a rollout engine takes it: a PEFT adapter directory, or
# ``(tensors, adapter_config)`` as the trainer's ``adapter_weights()`` gives them;
# None: the base weights alone.
LoraAdapter = str | tuple[dict[str, torch.Tensor], dict] | None
# What a vLLM weight transfer receives by: the names, dtypes and shapes sent
# (``rlpost.runtime.vllm_transfer.layout``).
WeightLayout = dict[str, list]


@dataclass(frozen=True)
class SamplingConfig:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 16
    # No end token before this many (capped at max_tokens): forces long completions.
    min_tokens: int = 0
    seed: int | None = None


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    sampling: SamplingConfig
    session_id: str | None = None
    # A vision-language prompt's images (PIL), in order. ``prompt_ids`` then hold
    # one placeholder per image, as the chat template renders it; the engine
    # expands each into the image's tokens, and the result's ``prompt_ids`` are
    # the expanded ids (what the trainer scores).
    images: list[Image] | None = None


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]  # log-prob of each sampled token under the engine's policy
    text: str
    finish_reason: str  # "stop" (end token) or "length"
    # A multi-turn episode: 1 on sampled tokens, 0 on environment tokens (None: all
    # sampled); its own prompt when its environment opened it differently from the
    # group's; and the episode itself (messages, environment reward) for scoring.
    mask: list[int] | None = None
    prompt_ids: list[int] | None = None
    episode: Episode | None = None
    # The policy version (updates applied) that sampled each token; environment
    # tokens of an episode get -1. None: the engine does not say.
    versions: list[int] | None = None
    # An agent program's trajectory split by prefix breaks: the segments before this
    # one, each a sample of the same episode (its own prompt, mask and log-probs)
    # that shares the episode's reward and advantage. None: one segment.
    segments: list[Completion] | None = None


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    completions: list[Completion] = field(default_factory=list)
    # (name, start, end) in time.time() seconds: where the engine spent the request
    # (queued, prefill, decode, interrupted), for the run timeline; empty if unknown
    segments: list[tuple[str, float, float]] = field(default_factory=list)


class RolloutEngine(Protocol):
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]: ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None: ...

    def stats(self) -> dict[str, float]: ...

    def reset_prefix_cache(self) -> None: ...


class AsyncRolloutEngine(RolloutEngine, Protocol):
    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        """One request; concurrent calls share the engine (continuous batching)."""
        ...

    async def aload_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load weights once the requests in flight finish; new ones wait meanwhile."""
        ...


@runtime_checkable
class Versioned(Protocol):
    """An engine that stamps each sampled token with the policy version that
    sampled it, and can load new weights under requests in flight (vLLM)."""

    version: int

    async def aload_weights(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        version: int | None = None,
        interrupt: bool = False,
    ) -> None:
        """Load as the policy ``version``; ``interrupt``: stop the requests in flight
        where they are and continue them under the new weights."""
        ...


@runtime_checkable
class GroupReceiver(Protocol):
    """Weights over a process group whose rank 0 is the trainer
    (``rollout.weight_sync=collective``)."""

    def open_weight_group(
        self, address: str, base_rank: int, world_size: int, generation: int, timeout_s: float
    ) -> None: ...

    async def areceive_weights(
        self,
        version: int | None = None,
        interrupt: bool = False,
        layout: WeightLayout | None = None,
    ) -> None: ...


class IpcTensorSource(Protocol):
    """What an engine's worker reads during an ``ipc`` weight sync
    (``rlpost.workers.ipc_source.IpcSource``): the trainer's buckets, one at a time,
    as named tensors, each bucket counted in ``stats``."""

    def tensors(self, stats: SyncStats) -> Iterator[tuple[str, torch.Tensor]]: ...


@runtime_checkable
class IpcReceiver(Protocol):
    """Weights as memory the trainer hands out on the same node (``rollout.weight_sync=ipc``)."""

    async def areceive_weights_ipc(
        self, source: IpcTensorSource, version: int | None = None, interrupt: bool = False
    ) -> None: ...


@runtime_checkable
class AdapterLoader(Protocol):
    """A LoRA adapter swapped in over the base model (``rollout.lora_sync=adapter``)."""

    async def aload_lora_adapter(
        self, adapter: LoraAdapter, version: int | None = None, interrupt: bool = False
    ) -> None: ...


@runtime_checkable
class Sleeper(Protocol):
    """Device memory given up while a colocated trainer trains (``rollout.sleep``)."""

    async def asleep(self, level: int = 2) -> None:
        """``level`` (vLLM): 1 keeps the weights in host memory, 2 drops them."""
        ...

    async def awake(self, tags: list[str] | None = None) -> None:
        """``tags`` (vLLM): ``["weights"]`` or ``["kv_cache"]`` alone."""
        ...
