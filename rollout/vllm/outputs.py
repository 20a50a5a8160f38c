"""Between rlpost's requests and vLLM's: a ``GenerationResult`` from a vLLM
``RequestOutput``, an ``n``-sample request as ``n`` one-sample requests, and a
request continued after a weight load interrupted it (partial rollout)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from rlpost.rollout.base import Completion, GenerationRequest, GenerationResult, SamplingConfig

if TYPE_CHECKING:
    from vllm.outputs import RequestOutput


@dataclass
class Interrupted:
    """What a request sampled before a weight load stopped it."""

    token_ids: list[int]
    logprobs: list[float]


def child_sampling(s: SamplingConfig, i: int) -> SamplingConfig:
    """Sample ``i`` of ``n`` as a request of its own (vLLM seeds child ``i`` ``seed + i``)."""
    return replace(s, n=1, seed=None if s.seed is None else s.seed + i)


def continuation(request: GenerationRequest, ids: list[int], segment: int) -> GenerationRequest:
    """``request`` continued after ``ids``: they join the prompt and count against
    its token limits; a seeded request draws a fresh stream per segment."""
    if not ids:
        return request
    s = request.sampling
    sampling = replace(
        s,
        max_tokens=s.max_tokens - len(ids),
        min_tokens=max(0, s.min_tokens - len(ids)),
        seed=None if s.seed is None else s.seed + 1_000_003 * segment,
    )
    return replace(request, prompt_ids=request.prompt_ids + ids, sampling=sampling)


def to_result(
    request: GenerationRequest,
    out: RequestOutput,
    tokenizer: Any,  # transformers': vLLM types it as its TokenizerLike, without batch_decode
) -> GenerationResult:
    """vLLM's finished ``out`` for ``request``: each sample's ids, log-probs and text."""
    completions = []
    all_ids = [list(c.token_ids) for c in out.outputs]
    texts = tokenizer.batch_decode(all_ids, skip_special_tokens=True)
    for c, ids, text in zip(out.outputs, all_ids, texts, strict=True):
        # logprobs=0 returns the sampled token's log-prob at every position.
        lps = [step[tok].logprob for step, tok in zip(c.logprobs or [], ids) if step]
        completions.append(
            Completion(
                token_ids=ids,
                logprobs=lps,
                text=text,
                finish_reason="length" if c.finish_reason == "length" else "stop",
            )
        )
    # With images the engine expanded their placeholders: its prompt ids are the real ones.
    prompt = out.prompt_token_ids if request.images else request.prompt_ids
    assert prompt is not None, "vLLM returns a token prompt's ids"
    return GenerationResult(prompt_ids=list(prompt), completions=completions)


def request_segments(out: RequestOutput) -> list[tuple[str, float, float]]:
    """Where vLLM spent a finished request, from its ``metrics``: ``queued`` until
    scheduled, ``prefill`` until the first token, ``decode`` until the last.

    vLLM stamps the arrival in wall-clock time and the rest on the monotonic clock
    of this process (the engine core runs in it: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``),
    so those are moved onto the wall clock here. Empty when vLLM kept no stats.
    """
    import time

    m = getattr(out, "metrics", None)
    stamps = [
        getattr(m, k, 0.0) for k in ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts")
    ]
    if m is None or not all(stamps):
        return []
    shift = time.time() - time.monotonic()
    queued, scheduled, first, last = (t + shift for t in stamps)
    return [("queued", queued, scheduled), ("prefill", scheduled, first), ("decode", first, last)]
