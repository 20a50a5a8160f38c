"""What every rollout engine takes and returns.

An engine is any object with ``generate``, ``load_weights``, ``stats`` (see
``RolloutEngine``); the async form (``AsyncRolloutEngine``) adds
``agenerate`` for one request and ``aload_weights``, which a Ray actor in
``rlpost/workers`` awaits so requests from many callers interleave.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch


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
    images: list[Any] | None = None


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
    episode: Any = None
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
