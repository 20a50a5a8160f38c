"""Ulysses sequence parallelism for the FSDP2 engines (``trainer.ulysses=N``).

Legend: b = samples, s = tokens of the whole sequence, l = this rank's s / N,
h = query heads, k = key/value heads, d = head size, v = vocab.

The N ranks of one sequence-parallel group hold the same samples and 1/N of
every sequence each. The model runs on a rank's slice of tokens; inside each
attention layer an all-to-all trades the slice of tokens for a slice of heads
(q, k, v: (b, h, l, d) -> (b, h / N, s, d)), attention runs over the whole
sequence for those heads, and a second all-to-all trades back. Everything
outside attention is per token, so it needs no communication. The per-token
outputs (log-probs, entropies, values) are then gathered, and every rank of the
group computes the same loss from the same whole rows.

Gradients: the all-to-all's backward is the reverse all-to-all, and the gather's
backward keeps this rank's slice of the (identical) gradient, so each rank's
parameter gradient is its slice's share and their sum is the whole gradient;
FSDP's reduce over every rank then adds the groups, as without Ulysses.

Rows come in two layouts: padded rows (right padding, so plain causal attention
never lets a real token see a pad) and one packed row, whose samples are
attended one at a time (causal within a sample, nothing across). Both are padded
to a multiple of N tokens.

gloo has ``all_to_all_single``; the autograd version is torch's functional
collective.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F

from rlpost.trainers.distributed import all_gather

ATTENTION = "rlpost_ulysses"  # the name the attention function is registered under


@dataclass(frozen=True)
class Slices:
    """What one forward pass's attention layers need to know: the group, and the
    samples' lengths in a packed row (None: padded rows, plain causal attention)."""

    group: dist.ProcessGroup
    size: int
    segments: list[int] | None


_ACTIVE: ContextVar[Slices | None] = ContextVar("rlpost_ulysses", default=None)
_CALLS = [0]  # attention calls made under a group (the engine checks the model uses it)


def _all_to_all(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Chunk i of ``x``'s dim 0 goes to rank i; chunk j of the result came from rank j."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor

    return wait_tensor(all_to_all_single_autograd(x.contiguous(), None, None, group))


def seq_to_heads(x_bhld: torch.Tensor, n: int, group: dist.ProcessGroup) -> torch.Tensor:
    """(b, H, l, d) on each rank -> (b, H / n, s, d): this rank's heads, every token."""
    b, heads, span, d = x_bhld.shape
    x = x_bhld.reshape(b, n, heads // n, span, d).permute(1, 0, 2, 3, 4)  # (n, b, H/n, l, d)
    y = _all_to_all(x, group)  # chunk j: rank j's tokens of this rank's heads
    return y.permute(1, 2, 0, 3, 4).reshape(b, heads // n, n * span, d)


def heads_to_seq(x_bshd: torch.Tensor, n: int, group: dist.ProcessGroup) -> torch.Tensor:
    """(b, s, H / n, d) on each rank -> (b, l, H, d): this rank's tokens, every head."""
    b, s, hn, d = x_bshd.shape
    x = x_bshd.reshape(b, n, s // n, hn, d).permute(1, 0, 2, 3, 4)  # (n, b, l, H/n, d)
    y = _all_to_all(x, group)  # chunk j: rank j's heads of this rank's tokens
    return y.permute(1, 2, 0, 3, 4).reshape(b, s // n, n * hn, d)


def attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,  # on to transformers' sdpa, whose keywords are typed one by one
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: sdpa over the whole sequence for this rank's
    heads while a group is active (``slices``), plain sdpa otherwise (a forward that
    is not sequence-parallel, e.g. the warm-up's greedy check)."""
    active = _ACTIVE.get()
    if active is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    _CALLS[0] += 1
    n, group = active.size, active.group
    kv_heads = key.shape[1]
    if kv_heads % n:  # fewer key/value heads than ranks: each rank gets a copy of its one
        key = key.repeat_interleave(n // kv_heads, dim=1)
        value = value.repeat_interleave(n // kv_heads, dim=1)
    q = seq_to_heads(query, n, group)
    k, v = seq_to_heads(key, n, group), seq_to_heads(value, n, group)
    if q.shape[1] != k.shape[1]:  # grouped-query attention: each query head's key head
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    if active.segments is None:
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout, scale=scaling, is_causal=True
        )
    else:
        parts, start = [], 0
        for length in active.segments:
            rows = slice(start, start + length)
            parts.append(
                F.scaled_dot_product_attention(
                    q[:, :, rows], k[:, :, rows], v[:, :, rows],
                    dropout_p=dropout, scale=scaling, is_causal=True,
                )
            )  # fmt: skip
            start += length
        out = torch.cat(parts, dim=2)
    return heads_to_seq(out.transpose(1, 2), n, group), None


def register() -> None:
    """Make ``ATTENTION`` a name transformers' models accept (once per process)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)


class _GatherContext(Protocol):
    """What ``_GatherTokens.forward`` keeps on torch's ``ctx`` for the backward."""

    rank: int
    width: int


class _GatherTokens(torch.autograd.Function):
    """All-gather along the token dim; the backward keeps this rank's slice.

    That is the whole gradient only because every rank of the group computes the
    same loss from the gathered rows: the gradient arriving here is the same on
    each, and its slice ``rank`` is what this rank's tokens are owed."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: _GatherContext, x: torch.Tensor, group: dist.ProcessGroup, n: int, rank: int
    ) -> torch.Tensor:
        ctx.rank, ctx.width = rank, x.shape[1]
        return torch.cat(all_gather(x, group), dim=1)

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: _GatherContext, g: torch.Tensor
    ) -> tuple[torch.Tensor, None, None, None]:
        return g.narrow(1, ctx.rank * ctx.width, ctx.width).contiguous(), None, None, None


class SequenceParallel:
    """One rank's place in its sequence-parallel group of ``size`` consecutive ranks.

    Every rank builds every group (``dist.new_group`` is collective), in order."""

    def __init__(self, size: int, rank: int, world_size: int):
        if world_size % size:
            raise ValueError(f"ulysses={size} does not divide the {world_size} trainer ranks")
        self.size, self.rank = size, rank % size
        groups = [dist.new_group(list(range(f, f + size))) for f in range(0, world_size, size)]
        self.group: dist.ProcessGroup = groups[rank // size]  # the one holding this rank
        register()

    def padded(self, width: int) -> int:
        """``width`` rounded up to a multiple of the group's size."""
        return -(-width // self.size) * self.size

    def local(self, x_bs: torch.Tensor) -> torch.Tensor:
        """This rank's slice of tokens of ``x_bs`` (its width a multiple of the size)."""
        width = x_bs.shape[1] // self.size
        return x_bs[:, self.rank * width : (self.rank + 1) * width]

    def gather(self, x_bl: torch.Tensor) -> torch.Tensor:
        """Every rank's slice of per-token values, joined: (b, l) -> (b, s)."""
        return _GatherTokens.apply(x_bl, self.group, self.size, self.rank)

    @contextmanager
    def attending(self, segments: list[int] | None) -> Iterator[None]:
        """Attention layers run under this group while the block runs."""
        before = _CALLS[0]
        token = _ACTIVE.set(Slices(self.group, self.size, segments))
        try:
            yield
        finally:
            _ACTIVE.reset(token)
        if _CALLS[0] == before:
            raise RuntimeError(
                "trainer.ulysses: the model's attention layers did not call the "
                "sequence-parallel attention (a model whose attention does not go through "
                "transformers' attention interface); set trainer.ulysses=1"
            )

    def inputs(
        self, ids_bs: torch.Tensor, lengths: list[int] | None
    ) -> tuple[torch.Tensor, torch.Tensor, list[int] | None]:
        """This rank's token ids and positions, and the packed row's segments.

        ``lengths`` None: padded rows (b, t), positions 0..t-1. Else one packed row
        (1, T) of samples of those lengths, positions restarting at each. The width
        is padded to a multiple of the size; in a packed row the padding is a
        segment of its own."""
        width = ids_bs.shape[1]
        extra = self.padded(width) - width
        ids = F.pad(ids_bs, (0, extra))
        if lengths is None:
            pos = torch.arange(width + extra).expand(ids.shape[0], -1)
            segments = None
        else:
            segments = list(lengths) + ([extra] if extra else [])
            pos = torch.cat([torch.arange(n) for n in segments])[None]
        return self.local(ids), self.local(pos), segments


def next_ids(ids_bs: torch.Tensor, width: int) -> torch.Tensor:
    """The token each position predicts (0 past the end), padded to ``width`` columns."""
    return F.pad(ids_bs[:, 1:], (0, width - ids_bs.shape[1] + 1))
