"""Per-token log-probs and entropies, a chunk of tokens at a time, from logits or
from the last hidden states and the output layer's weight.

Legend: b = samples, t = tokens, v = vocab, d = hidden size, n = tokens of a
flattened (b, t), c = tokens of one chunk.

``log_softmax(logits.float())`` materialises a float32 [b, t, v] tensor and
autograd keeps it for the backward pass; the division by the temperature, the
gather's backward and the entropy's softmax each add another. At a 150k
vocabulary that is 2.4 GB per 4,096 tokens, every time. Here the forward pass
walks over chunks of tokens and keeps two floats per token (the log-prob and the
entropy); the backward pass recomputes each chunk's softmax and writes its
gradient chunk by chunk.

Two entry points:

- ``token_logprobs_and_entropy`` takes the model's logits: peak memory is the
  logits and their gradient, in the model's dtype, plus one chunk's float32
  temporaries.
- ``hidden_token_stats`` takes the hidden states the output layer would read and
  its weight, and computes each chunk's logits itself (again in the backward
  pass): the [b, t, v] logits and their gradient never exist. At a 150k
  vocabulary they are 10 GB apiece for 32k tokens in bf16.

How many tokens a chunk holds follows the device's workspace
(``rlpost.runtime.device.workspace_bytes``): a few MiB on a CPU, whose caches
favour small chunks; about a GiB on an accelerator, where a chunk of a few dozen
tokens leaves every kernel too small to keep it busy (launch-bound).

Both take ``needed_bt``, the tokens whose log-prob a loss or metric reads (a
policy update's response tokens): the chunks walk only the positions that predict
them, and the rest are 0. A prompt of 512 tokens before a response of 1,536 is a
quarter of the output layer's work, forward and backward, that no loss reads.

One chunk's math is ``rlpost.trainers.chunk_kernels``': torch's eager kernels, or
with ``compiled=True`` (``trainer.compile``) the same math compiled into a few
fused kernels that hold no float32 copy of the chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from rlpost.runtime import device as devices
from rlpost.trainers.chunk_kernels import ChunkKernels, kernels
from rlpost.trainers.chunk_kernels import chunk_tokens as chunk_tokens  # re-exported

# float32 elements of a chunk's temporaries on a CPU (16 MiB each, two at a time):
# 27 tokens at a 150k vocabulary, the whole batch at a small one.
CHUNK_ELEMENTS = 1 << 22
_LOWEST = torch.finfo(torch.float32).min


# A chunk's rows: a slice of every row, or a piece of the index of the needed rows.
Rows = slice | torch.Tensor


@dataclass(frozen=True)
class _Walk:
    """How one call walks its chunks: the softmax's temperature, whether the entropy
    is wanted, tokens per chunk, the rows it computes (indices into the flattened
    (b, t); all when None, and 0 in the others), the chunk kernels, and the tokens
    whose logits are set to the lowest value (the output layer folded in)."""

    temperature: float
    with_entropy: bool
    chunk: int
    rows_k: torch.Tensor | None
    kernels: ChunkKernels
    never_v: torch.Tensor | None = None

    def chunks(self, n: int) -> list[Rows]:
        """The chunks of ``chunk`` rows that cover ``rows_k``, or all ``n`` rows."""
        if self.rows_k is None:
            return [slice(s, s + self.chunk) for s in range(0, n, self.chunk)]
        k = self.rows_k.shape[0]
        return [self.rows_k[s : s + self.chunk] for s in range(0, k, self.chunk)]

    def stats(
        self, logits_of: Callable[[Rows], torch.Tensor], ids_n: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(logp_n, entropy_n; zeros without ``with_entropy``) chunk by chunk,
        ``logits_of(rows)`` giving a chunk's logits (held only while it is computed)."""
        logp_n = torch.zeros(ids_n.shape[0], dtype=torch.float32, device=ids_n.device)
        entropy_n = torch.zeros_like(logp_n)
        for rows in self.chunks(ids_n.shape[0]):
            logp_n[rows], ent = self.kernels.forward(
                logits_of(rows), ids_n[rows], self.temperature, self.with_entropy
            )
            if ent is not None:
                entropy_n[rows] = ent
        return logp_n, entropy_n

    def grad(
        self,
        logits_cv: torch.Tensor,
        rows: Rows,
        ids_n: torch.Tensor,
        g_logp_n: torch.Tensor | None,
        g_entropy_n: torch.Tensor | None,
        entropy_n: torch.Tensor,
    ) -> torch.Tensor:
        """One chunk's d/dlogits, in float32 or the logits' dtype (``Grad``)."""
        return self.kernels.grad(
            logits_cv,
            ids_n[rows],
            self.temperature,
            None if g_logp_n is None else g_logp_n[rows],
            None if g_entropy_n is None else g_entropy_n[rows],
            entropy_n[rows],
            self.never_v,
        )


class _StatsContext(Protocol):
    """The ``ctx`` torch hands ``_TokenStats`` and ``_HiddenTokenStats``: its own
    methods and what ``forward`` keeps on it for ``backward``."""

    saved_tensors: tuple[torch.Tensor, ...]
    needs_input_grad: tuple[bool, ...]
    walk: _Walk

    def save_for_backward(self, *tensors: torch.Tensor) -> None: ...

    def set_materialize_grads(self, value: bool) -> None: ...

    def mark_non_differentiable(self, *args: torch.Tensor) -> None: ...


def _keep(ctx: _StatsContext, walk: _Walk, entropy_n: torch.Tensor, *saved: torch.Tensor) -> None:
    ctx.save_for_backward(*saved, entropy_n)
    ctx.walk = walk
    ctx.set_materialize_grads(False)
    if not walk.with_entropy:
        ctx.mark_non_differentiable(entropy_n)


class _TokenStats(torch.autograd.Function):
    """(logits_nv, ids_n) -> (logp_n, entropy_n) of softmax(logits / temperature) at
    the walk's rows, 0 elsewhere."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: _StatsContext, logits_nv: torch.Tensor, ids_n: torch.Tensor, walk: _Walk
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logp_n, entropy_n = walk.stats(lambda rows: logits_nv[rows], ids_n)
        _keep(ctx, walk, entropy_n, logits_nv, ids_n)
        return logp_n, entropy_n

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: _StatsContext, g_logp_n: torch.Tensor | None, g_entropy_n: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, None, None]:
        logits_nv, ids_n, entropy_n = ctx.saved_tensors
        walk = ctx.walk
        if not walk.with_entropy:
            g_entropy_n = None
        if g_logp_n is None and g_entropy_n is None:
            return None, None, None
        # rows outside rows_k gave 0, whatever their logits: their gradient is 0
        grad_nv = (
            torch.empty_like(logits_nv) if walk.rows_k is None else torch.zeros_like(logits_nv)
        )
        for rows in walk.chunks(logits_nv.shape[0]):
            grad_nv[rows] = walk.grad(
                logits_nv[rows], rows, ids_n, g_logp_n, g_entropy_n, entropy_n
            )
        return grad_nv, None, None


def _chunk_logits(
    hidden_cd: torch.Tensor, weight_vd: torch.Tensor, never_v: torch.Tensor | None
) -> torch.Tensor:
    """One chunk's logits, as the output layer computes them; the tokens ``never_v``
    marks (the rollout never samples them) at the dtype's lowest value, as
    ``FSDPEngine._logits`` sets them."""
    logits_cv = F.linear(hidden_cd, weight_vd)
    if never_v is not None:
        logits_cv.masked_fill_(never_v, torch.finfo(logits_cv.dtype).min)
    return logits_cv


class _HiddenTokenStats(torch.autograd.Function):
    """(hidden_nd, weight_vd, ids_n) -> (logp_n, entropy_n) of softmax(hidden @ W^T / T)
    at the walk's rows, 0 elsewhere, each chunk's logits computed in the forward pass
    and again in the backward."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: _StatsContext,
        hidden_nd: torch.Tensor,
        weight_vd: torch.Tensor,
        ids_n: torch.Tensor,
        walk: _Walk,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logp_n, entropy_n = walk.stats(
            lambda rows: _chunk_logits(hidden_nd[rows], weight_vd, walk.never_v), ids_n
        )
        _keep(ctx, walk, entropy_n, hidden_nd, weight_vd, ids_n)
        return logp_n, entropy_n

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: _StatsContext, g_logp_n: torch.Tensor | None, g_entropy_n: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        hidden_nd, weight_vd, ids_n, entropy_n = ctx.saved_tensors
        walk = ctx.walk
        if not walk.with_entropy:
            g_entropy_n = None
        if g_logp_n is None and g_entropy_n is None:
            return None, None, None, None
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = None
        if need_h:  # rows outside rows_k gave 0, whatever their hidden states
            grad_hidden = (torch.empty_like if walk.rows_k is None else torch.zeros_like)(hidden_nd)
        # the weight's gradient adds up over chunks in float32: one rounding per chunk
        # to the weight's dtype, as the whole product would have one
        grad_weight = torch.zeros_like(weight_vd, dtype=torch.float32) if need_w else None
        for rows in walk.chunks(hidden_nd.shape[0]):
            # the never-sampled tokens' logits were overwritten: their gradient is 0
            logits_cv = _chunk_logits(hidden_nd[rows], weight_vd, walk.never_v)
            g_cv = walk.grad(logits_cv, rows, ids_n, g_logp_n, g_entropy_n, entropy_n)
            g_cv = g_cv.to(hidden_nd.dtype)  # a no-op for the compiled kernels
            del logits_cv
            if grad_hidden is not None:
                grad_hidden[rows] = g_cv @ weight_vd
            if grad_weight is not None:
                grad_weight.add_(g_cv.t() @ hidden_nd[rows])
            del g_cv
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight_vd.dtype)
        return grad_hidden, grad_weight, None, None


def token_logprobs_and_entropy(
    logits_btv: torch.Tensor,
    input_ids_bt: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = True,
    chunk_elements: int | None = None,
    plain_elements: int = CHUNK_ELEMENTS,
    needed_bt: torch.Tensor | None = None,
    compiled: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logp_bt, entropy_bt)`` of ``softmax(logits / temperature)``, float32, aligned
    with ``input_ids_bt``: position t holds log p(token_t | tokens_<t) and the entropy
    of that prediction; position 0 is 0 in both.

    The same values and gradients as ``log_softmax`` + ``gather`` and
    ``algos.entropy_from_logits`` on the float32 logits, without their [b, t, v]
    float32 intermediates. ``with_entropy=False`` skips the entropy (returned as
    zeros, without gradient). ``chunk_elements``: logits per chunk (default: the
    device's workspace). Logits of at most ``plain_elements`` elements (a small
    vocabulary, as the built-in models have) take the plain path, whose float32
    rounding the built-in model's cached warm-up was made with. ``needed_bt``
    (bool, best on the CPU): the tokens whose values are read; the others are 0
    and get no gradient, and the chunked path never computes them. ``compiled``:
    each chunk by ``chunk_kernels.compiled_kernels()`` (``trainer.compile``).
    """
    b, t, v = logits_btv.shape
    if b * t * v <= plain_elements:  # small enough to hold whole: the plain computation
        # over positions 0..t-2 exactly as before (the cached warm-ups' rounding)
        logp_bt, entropy_bt = _plain(
            logits_btv[:, :-1], input_ids_bt[:, 1:], temperature, with_entropy
        )
        return _only(F.pad(logp_bt, (1, 0)), needed_bt), _only(F.pad(entropy_bt, (1, 0)), needed_bt)
    chunk_kernels = kernels(compiled)
    if chunk_elements is None:
        chunk = chunk_kernels.tokens(v, logits_btv.device.type, logits_btv.element_size(), False)
    else:
        chunk = max(1, chunk_elements // v)
    rows_k = _needed_rows(needed_bt, logits_btv.device)
    walk = _Walk(temperature, with_entropy, chunk, rows_k, chunk_kernels)
    ids_n = _next_ids(input_ids_bt).reshape(-1)
    logp_n, entropy_n = _TokenStats.apply(logits_btv.reshape(b * t, v), ids_n, walk)
    return _shifted(logp_n.view(b, t)), _shifted(entropy_n.view(b, t))


def next_token_stats(
    logits_btv: torch.Tensor,
    next_ids_bt: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = True,
    compiled: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``token_logprobs_and_entropy`` before its shift: position t holds
    log p(next_ids_t | logits_t) and the entropy of the logits at t. A slice of a
    sequence (``trainer.ulysses``) predicts its next slice's first token too."""
    b, t, v = logits_btv.shape
    if b * t * v <= CHUNK_ELEMENTS:  # small enough to hold whole: the plain computation
        return _plain(logits_btv, next_ids_bt, temperature, with_entropy)
    chunk_kernels = kernels(compiled)
    chunk = chunk_kernels.tokens(v, logits_btv.device.type, logits_btv.element_size(), False)
    walk = _Walk(temperature, with_entropy, chunk, None, chunk_kernels)
    logp_n, entropy_n = _TokenStats.apply(
        logits_btv.reshape(b * t, v), next_ids_bt.reshape(-1), walk
    )
    return logp_n.view(b, t), entropy_n.view(b, t)


def hidden_token_stats(
    hidden_btd: torch.Tensor,
    weight_vd: torch.Tensor,
    input_ids_bt: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = True,
    never: tuple[int, ...] = (),
    chunk: int | None = None,
    plain_elements: int = CHUNK_ELEMENTS,
    needed_bt: torch.Tensor | None = None,
    compiled: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``token_logprobs_and_entropy`` of the logits ``F.linear(hidden, weight)`` (the
    output layer's), without holding them: each chunk of tokens computes its own,
    twice (forward and backward). Gradients reach ``hidden_btd`` and ``weight_vd``.
    ``never``: token ids whose logits are set to the dtype's lowest value (tokens the
    rollout never samples). ``chunk``: tokens per chunk (default: the device's
    workspace, with room for the chunk's logits). ``needed_bt`` and ``compiled``:
    as there; the output layer runs only on the hidden states that predict the
    needed tokens."""
    b, t, d = hidden_btd.shape
    v = weight_vd.shape[0]
    if b * t * v <= plain_elements:  # the logits whole, as the output layer makes them
        logits_btv = F.linear(hidden_btd, weight_vd)
        if never:
            logits_btv[..., list(never)] = torch.finfo(logits_btv.dtype).min
        return token_logprobs_and_entropy(
            logits_btv, input_ids_bt, temperature, with_entropy, None, plain_elements, needed_bt
        )
    chunk_kernels = kernels(compiled)
    if chunk is None:
        chunk = chunk_kernels.tokens(v, hidden_btd.device.type, hidden_btd.element_size(), True)
    never_v = None
    if never:
        never_v = torch.zeros(v, dtype=torch.bool)
        never_v[list(never)] = True
        never_v = devices.upload(never_v, hidden_btd.device)
    rows_k = _needed_rows(needed_bt, hidden_btd.device)
    walk = _Walk(temperature, with_entropy, chunk, rows_k, chunk_kernels, never_v)
    ids_n = _next_ids(input_ids_bt).reshape(-1)
    logp_n, entropy_n = _HiddenTokenStats.apply(
        hidden_btd.reshape(b * t, d), weight_vd, ids_n, walk
    )
    return _shifted(logp_n.view(b, t)), _shifted(entropy_n.view(b, t))


def _next_ids(input_ids_bt: torch.Tensor) -> torch.Tensor:
    """The token each position predicts; the last position predicts nothing (id 0)."""
    return F.pad(input_ids_bt[:, 1:], (0, 1))


def _shifted(next_bt: torch.Tensor) -> torch.Tensor:
    """Values of each position's prediction moved onto the token predicted."""
    return F.pad(next_bt[:, :-1], (1, 0))


def _needed_rows(needed_bt: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """Indices into the flattened (b, t) of the positions that predict a needed token,
    on ``device``; None when every position does (a slice walks them faster). Read
    from a CPU mask, this waits for nothing on the device."""
    if needed_bt is None:
        return None
    predicts_n = _next_ids(needed_bt.cpu()).reshape(-1).bool()
    if bool(predicts_n.all()):
        return None
    return devices.upload(predicts_n.nonzero()[:, 0], device)


def _only(values_bt: torch.Tensor, needed_bt: torch.Tensor | None) -> torch.Tensor:
    """``values_bt`` at the needed tokens, 0 (and no gradient) at the others."""
    if needed_bt is None:
        return values_bt
    return torch.where(devices.upload(needed_bt, values_bt.device).bool(), values_bt, 0.0)


def _plain(
    logits_btv: torch.Tensor, next_ids_bt: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``next_token_stats`` by ``log_softmax`` over the whole float32 tensor: for
    batches whose logits fit one chunk, where chunking saves nothing."""
    from rlpost.algos import entropy_from_logits

    z_btv = (logits_btv.float() / temperature).clamp(min=_LOWEST)
    logp_bt = F.log_softmax(z_btv, dim=-1).gather(-1, next_ids_bt[..., None])[..., 0]
    if with_entropy:
        return logp_bt, entropy_from_logits(z_btv)
    return logp_bt, torch.zeros_like(logp_bt).detach()


def token_logprobs(
    logits_btv: torch.Tensor, input_ids_bt: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """log p(token_t | tokens_<t) under softmax(logits / temperature), aligned with
    input_ids (position 0 is 0); see ``token_logprobs_and_entropy``."""
    return token_logprobs_and_entropy(logits_btv, input_ids_bt, temperature, False)[0]
