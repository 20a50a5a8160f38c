"""The model sampler's pieces (``ModelHost.sample_queued``): a sample request
waiting for the host's worker, how waiting requests are cut into batches, and
how a request's rows draw their next token."""

from __future__ import annotations

import math
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from rlpost.serve.wire import SampledOut, SampleParams


@dataclass
class SampleRequest:
    """One ``asample`` waiting for the host's worker; ``answer`` holds its sequences
    and prompt log-probs (or its error) once it is done."""

    key: str  # the sampler snapshot
    prompt: list[int]
    n: int
    params: SampleParams
    prompt_logprobs: bool
    answer: Future[tuple[list[SampledOut], list[float] | None]] = field(default_factory=Future)


def pass_on(answer: Future, pending: Future) -> None:
    """``pending``'s outcome (the vLLM engine's) as ``answer``'s."""
    if pending.exception() is not None:
        answer.set_exception(pending.exception())
    else:
        answer.set_result(pending.result())


def batches(requests: list[SampleRequest], rows: int) -> Iterator[list[SampleRequest]]:
    """``requests`` in order, in batches of at most ``rows`` sequences (a request
    asking for more is a batch of its own)."""
    batch: list[SampleRequest] = []
    for r in requests:
        if batch and sum(b.n for b in batch) + r.n > rows:
            yield batch
            batch = []
        batch.append(r)
    if batch:
        yield batch


def draw(logp_bv: torch.Tensor, params: SampleParams, generator: torch.Generator) -> torch.Tensor:
    """A token per row from ``logp_bv`` cut to its top-k and top-p."""
    if params.temperature <= 0:
        return logp_bv.argmax(-1)
    logp = logp_bv.cpu()
    if params.top_k > 0:
        kth = logp.topk(min(params.top_k, logp.shape[-1]), -1).values[:, -1:]
        logp = logp.masked_fill(logp < kth, -math.inf)
    if params.top_p < 1:
        sorted_lp, order = logp.sort(-1, descending=True)
        before = sorted_lp.exp().cumsum(-1) - sorted_lp.exp()  # mass above each token
        sorted_lp = sorted_lp.masked_fill(before > params.top_p, -math.inf)
        logp = torch.full_like(logp, -math.inf).scatter(-1, order, sorted_lp)
    return torch.multinomial(logp.exp(), 1, generator=generator).view(-1).to(logp_bv.device)
