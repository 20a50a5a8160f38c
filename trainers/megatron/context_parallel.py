"""Context parallelism (``trainer.megatron.cp``) with any backend, gloo included.

Legend: b = samples, T = tokens of a micro-batch, S = T padded to a multiple of
2 x cp, s = S / cp (one rank's tokens), h = heads, d = head width.

megatron-core runs context parallelism only through Transformer Engine's
attention (CUDA); its own ``DotProductAttention`` refuses ``cp > 1``. Everything
else in the model already works per token, so this module supplies the rest:

- **Split.** A micro-batch's sequence is cut into 2 x cp equal chunks and rank
  r keeps chunks r and 2cp-1-r, megatron's load-balanced layout: with a causal
  mask every rank then has the same amount of attention to compute. megatron's
  rotary embedding picks the same chunks of its position table when a cp group
  is set, so each token is rotated by its global position.
- **Attention.** ``ContextParallelAttention`` replaces the layer spec's core
  attention: it all-gathers the keys and values of every rank (the backward
  sums their gradients over the ranks and keeps its own), and attends with the
  micro-batch's whole (S, S) mask indexed at the global positions of its
  queries and of the gathered keys. Padded rows and packed rows alike.
- **Output.** The last stage all-gathers the model's output back into the
  whole sequence, so each rank's loss is the micro-batch's whole loss. Every
  rank computes that same loss, so the backward keeps only its own tokens'
  gradient (no sum); the data-parallel gradient sum then runs over data x cp
  ranks, as megatron's DDP does with context parallelism, and counts every
  token once.

The all-gather keeps the whole keys and values of a layer on every rank: it
splits the activations, the MLPs and the attention's compute, not the
attention's key/value memory (a ring would; Transformer Engine's does).
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F

from rlpost.trainers.distributed import all_gather, all_reduce_


def rank_positions(seq: int, cp: int, rank: int) -> torch.Tensor:
    """Global positions of ``rank``'s tokens: chunks ``rank`` and ``2cp-1-rank`` of
    ``seq`` cut into 2 x cp (``seq`` a multiple of 2 x cp)."""
    c = seq // (2 * cp)
    first = torch.arange(rank * c, (rank + 1) * c)
    second = torch.arange((2 * cp - 1 - rank) * c, (2 * cp - rank) * c)
    return torch.cat([first, second])


def gathered_positions(seq: int, cp: int) -> torch.Tensor:
    """Global positions of an all-gather's rows (rank 0's tokens, then rank 1's, ...)."""
    return torch.cat([rank_positions(seq, cp, r) for r in range(cp)])


class _GatherSequence(torch.autograd.Function):
    """All-gather along ``dim`` in rank order. Backward: ``reduce=True`` sums the
    gradient over the ranks first (each rank's copy fed a different loss term),
    ``reduce=False`` does not (every rank computed the same loss); then each rank
    keeps the gradient of its own piece."""

    @staticmethod
    def forward(
        ctx, x: torch.Tensor, dim: int, group: dist.ProcessGroup | None, reduce: bool
    ) -> torch.Tensor:
        ctx.dim, ctx.group, ctx.reduce = dim, group, reduce
        ctx.rank, ctx.size = dist.get_rank(group), dist.get_world_size(group)
        return torch.cat(all_gather(x, group), dim=dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        grad = grad.contiguous()
        if ctx.reduce:
            all_reduce_(grad, ctx.group)
        piece = grad.shape[ctx.dim] // ctx.size
        return grad.narrow(ctx.dim, ctx.rank * piece, piece).contiguous(), None, None, None


def gather_sequence(
    x: torch.Tensor, dim: int, group: dist.ProcessGroup | None, reduce: bool
) -> torch.Tensor:
    return _GatherSequence.apply(x, dim, group, reduce)


def pad_inputs(
    ids_bT: torch.Tensor, pos_bT: torch.Tensor, mask_11TT: torch.Tensor, multiple: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids, positions (b, S) and the boolean mask (True: masked) (1, 1, S, S)
    padded to S, the next multiple of ``multiple``.

    Padding tokens go at the end; each sees only itself, and no real token sees
    them (their rows of the output are dropped).
    """
    T = ids_bT.shape[1]
    S = math.ceil(T / multiple) * multiple
    if S == T:
        return ids_bT, pos_bT, mask_11TT
    padded = torch.ones(S, S, dtype=torch.bool)
    padded[:T, :T] = mask_11TT[0, 0]
    padded[torch.arange(T, S), torch.arange(T, S)] = False
    return F.pad(ids_bT, (0, S - T)), F.pad(pos_bT, (0, S - T)), padded[None, None]


def split_inputs(
    ids_bS: torch.Tensor, pos_bS: torch.Tensor, group: dist.ProcessGroup | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's token ids and positions (b, s) of a sequence padded to a multiple
    of 2 x cp (``pad_inputs``)."""
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    mine = rank_positions(ids_bS.shape[1], cp, rank)
    return ids_bS[:, mine], pos_bS[:, mine]


def gather_output(out_bs: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """The last stage's output (b, s, ...) of every rank -> (b, S, ...) in sequence
    order; the backward keeps this rank's tokens' gradient."""
    cp = dist.get_world_size(group)
    full = gather_sequence(out_bs, 1, group, reduce=False)
    return full[:, torch.argsort(gathered_positions(full.shape[1], cp))]


class AttentionConfig(Protocol):
    """What ``ContextParallelAttention`` reads of megatron-core's ``TransformerConfig``."""

    attention_dropout: float
    kv_channels: int
    apply_query_key_layer_scaling: bool


class ContextParallelAttention(torch.nn.Module):
    """Core attention (the layer spec's ``core_attention``) over a sequence split
    across the context-parallel group: queries (s, b, h, d) of this rank's tokens,
    keys and values (s, b, g, d) gathered from every rank -> (s, b, h x d).

    Float32 softmax, no dropout (the engines train without it), grouped-query
    attention by repeating each key/value head over its query heads.
    """

    def __init__(
        self,
        config: AttentionConfig,
        layer_number: int,
        attn_mask_type: object,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: object = None,
    ):
        from megatron.core import parallel_state as mpu

        super().__init__()
        self.config = config
        if config.attention_dropout or attention_dropout:
            raise ValueError("context parallelism here runs without attention dropout")
        head = config.kv_channels
        self.softmax_scale = 1.0 / math.sqrt(head) if softmax_scale is None else softmax_scale
        if config.apply_query_key_layer_scaling:
            self.softmax_scale /= max(1, layer_number)
        self.group = getattr(pg_collection, "cp", None)
        if self.group is None:
            self.group = mpu.get_context_parallel_group()

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: object = None,
        attention_bias: object = None,
        packed_seq_params: object = None,
    ) -> torch.Tensor:
        if attention_mask is None or packed_seq_params is not None or attention_bias is not None:
            raise ValueError(
                "context-parallel attention takes the whole (S, S) mask; no packed-sequence "
                "parameters or attention bias"
            )
        cp, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        s, b, h, d = query.shape
        S = s * cp
        key = gather_sequence(key, 0, self.group, reduce=True)
        value = gather_sequence(value, 0, self.group, reduce=True)
        q_pos, k_pos = rank_positions(S, cp, rank), gathered_positions(S, cp)
        mask = attention_mask[:, :, q_pos][:, :, :, k_pos]  # (1|b, 1, s, S)
        q, k, v = (x.permute(1, 2, 0, 3).float() for x in (query, key, value))
        rep = h // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.softmax_scale
        probs = scores.masked_fill(mask, float("-inf")).softmax(dim=-1)
        out = torch.matmul(probs, v).to(query.dtype)  # (b, h, s, d)
        return out.permute(2, 0, 1, 3).reshape(s, b, h * d)
