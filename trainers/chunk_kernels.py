"""One chunk of ``rlpost.trainers.logprobs``: the float32 log-probs and entropies of a
chunk of logits, and the gradient the chunk sends back, in two forms.

Legend: c = tokens of one chunk, v = vocab.

- ``EAGER``: torch's kernels one after another, each a pass over the chunk's
  float32 temporaries (about 50 bytes a logit, forward and backward). On a CPU,
  whose caches hold a small chunk, that costs little. On a GPU each step is a pass
  over memory: the first H200 run's profile put the output layer's log-prob path at
  42 % of a long update, mostly in these passes rather than in its matrix products.
- ``compiled_kernels()`` (``trainer.compile``): the same math written as one
  expression per direction and compiled with ``torch.compile``. The forward becomes
  the log-softmax's reductions over the chunk's logits and the backward one more
  pass that writes the gradient in the logits' dtype: about 14 bytes a logit in
  bf16, and no float32 copy of the chunk is ever held, so a chunk can hold more
  tokens.

Both compute the same values within float32 rounding (the compiled kernels add in
another order); ``tests/unit/test_logprobs.py`` checks the one against the other.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlpost.runtime import device as devices

_LOWEST = torch.finfo(torch.float32).min

# (logits_cv, ids_c, temperature, with_entropy) -> (logp_c, entropy_c or None)
Forward = Callable[
    [torch.Tensor, torch.Tensor, float, bool], tuple[torch.Tensor, torch.Tensor | None]
]
# (logits_cv, ids_c, temperature, g_logp_c, g_entropy_c, entropy_c, never_v) -> g_cv,
# d/dlogits of sum(g_logp * logp + g_entropy * H), in float32 (eager) or the logits'
# dtype (compiled: cast in the fused pass); 0 at the tokens ``never_v`` marks (logits
# the forward overwrote)
Grad = Callable[
    [
        torch.Tensor,
        torch.Tensor,
        float,
        torch.Tensor | None,
        torch.Tensor | None,
        torch.Tensor,
        torch.Tensor | None,
    ],
    torch.Tensor,
]


@dataclass(frozen=True)
class ChunkKernels:
    forward: Forward
    grad: Grad
    compiled: bool

    def tokens(self, vocab: int, device_type: str, element_size: int, holds_logits: bool) -> int:
        """Tokens per chunk on ``device_type``: its workspace over what a chunk holds
        per logit. Eager: two float32 temporaries, and the chunk's logits where it
        computes them itself (``holds_logits``). Compiled: no float32 temporaries, the
        gradient in the logits' dtype, and the logits where it holds them."""
        if self.compiled:
            per_logit = element_size * (2 if holds_logits else 1)
        else:
            per_logit = 8 + (element_size if holds_logits else 0)
        return chunk_tokens(vocab, device_type, per_logit)


def chunk_tokens(vocab: int, device_type: str, bytes_per_element: int = 8) -> int:
    """Tokens per chunk on ``device_type``: its workspace over ``bytes_per_element``
    (two float32 temporaries; more where the chunk also holds its logits) per logit."""
    return max(1, devices.workspace_bytes(device_type) // (bytes_per_element * vocab))


# -- eager: torch's kernels in turn, in place where they can be ------------------


def _log_softmax(logits_cv: torch.Tensor, temperature: float) -> torch.Tensor:
    """float32 log-softmax of logits / T, in one kernel at T = 1 (the cast fused in)."""
    if temperature == 1.0:
        return torch.log_softmax(logits_cv, dim=-1, dtype=torch.float32)
    return torch.log_softmax(logits_cv.to(torch.float32, copy=True).div_(temperature), dim=-1)


def _softmax(logits_cv: torch.Tensor, temperature: float) -> torch.Tensor:
    if temperature == 1.0:
        return torch.softmax(logits_cv, dim=-1, dtype=torch.float32)
    return torch.softmax(logits_cv.to(torch.float32, copy=True).div_(temperature), dim=-1)


def _forward_chunk(
    logits_cv: torch.Tensor, ids_c: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logp_c, entropy_c or None) of one chunk. H = sum_v entr(p_v), entr(x) = -x ln x
    with entr(0) = 0, so a -inf logit (p = 0) adds nothing instead of 0 * inf = NaN."""
    lsm_cv = _log_softmax(logits_cv, temperature)
    logp_c = lsm_cv.gather(-1, ids_c[:, None])[:, 0]
    if not with_entropy:
        return logp_c, None
    p_cv = lsm_cv.exp_()  # lsm becomes p
    return logp_c, torch.special.entr(p_cv, out=p_cv).sum(-1)


def _grad_chunk(
    logits_cv: torch.Tensor,
    ids_c: torch.Tensor,
    temperature: float,
    g_logp_c: torch.Tensor | None,
    g_entropy_c: torch.Tensor | None,
    entropy_c: torch.Tensor,
) -> torch.Tensor:
    """float32 d/dlogits of sum(g_logp * logp + g_entropy * H) over one chunk.

    With z = logits / T and p = softmax(z): d logp / dz = onehot(id) - p and
    dH / dz = -p (log p + H); each times 1/T for the logits.
    """
    scale = 1.0 / temperature
    if g_entropy_c is None:  # one chunk-sized temporary
        g_cv = _softmax(logits_cv, temperature)
    else:
        lsm_cv = _log_softmax(logits_cv, temperature).clamp_(min=_LOWEST)
        g_cv = lsm_cv.exp()
        # lsm becomes g_H / T * dH/dz = -(g_H / T) * p * (log p + H)
        lsm_cv.add_(entropy_c[:, None]).mul_(g_cv).mul_(-scale * g_entropy_c[:, None])
    if g_logp_c is None:
        g_cv.zero_()
    else:
        g_cv.mul_(-scale * g_logp_c[:, None])
        g_cv.scatter_add_(-1, ids_c[:, None], scale * g_logp_c[:, None])
    if g_entropy_c is not None:
        g_cv.add_(lsm_cv)
    return g_cv


def _eager_grad(
    logits_cv: torch.Tensor,
    ids_c: torch.Tensor,
    temperature: float,
    g_logp_c: torch.Tensor | None,
    g_entropy_c: torch.Tensor | None,
    entropy_c: torch.Tensor,
    never_v: torch.Tensor | None,
) -> torch.Tensor:
    g_cv = _grad_chunk(logits_cv, ids_c, temperature, g_logp_c, g_entropy_c, entropy_c)
    if never_v is not None:
        g_cv.masked_fill_(never_v, 0)
    return g_cv


EAGER = ChunkKernels(_forward_chunk, _eager_grad, compiled=False)


# -- compiled: one expression each way, for a compiler to fuse -------------------


def _fused_forward(
    logits_cv: torch.Tensor, ids_c: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``_forward_chunk`` without in-place steps: (logp_c, entropy_c)."""
    lsm_cv = torch.log_softmax(logits_cv.float() / temperature, dim=-1)
    logp_c = lsm_cv.gather(-1, ids_c[:, None])[:, 0]
    return logp_c, torch.special.entr(lsm_cv.exp()).sum(-1)


def _fused_grad(
    logits_cv: torch.Tensor,
    ids_c: torch.Tensor,
    temperature: float,
    g_logp_c: torch.Tensor,
    g_entropy_c: torch.Tensor,
    entropy_c: torch.Tensor,
    never_v: torch.Tensor,
) -> torch.Tensor:
    """``_eager_grad`` as one element-wise expression after the log-softmax's
    reductions: the one-hot term a comparison with the token ids rather than a
    scatter, so that nothing but the result is written."""
    scale = 1.0 / temperature
    lsm_cv = torch.log_softmax(logits_cv.float() / temperature, dim=-1).clamp(min=_LOWEST)
    p_cv = lsm_cv.exp()
    g_logp = (scale * g_logp_c)[:, None]
    g_entropy = (scale * g_entropy_c)[:, None]
    hit_cv = torch.arange(logits_cv.shape[-1], device=logits_cv.device) == ids_c[:, None]
    g_cv = torch.where(hit_cv, g_logp, 0.0) - p_cv * (
        g_logp + g_entropy * (lsm_cv + entropy_c[:, None])
    )
    return g_cv.masked_fill(never_v, 0.0).to(logits_cv.dtype)


@functools.cache
def compiled_kernels() -> ChunkKernels:
    """The fused kernels, compiled on first use for any chunk length and vocabulary
    (``dynamic=True``): one graph per logits dtype and temperature each way, and one
    more for a chunk of a single row (torch specialises sizes 0 and 1)."""
    forward = torch.compile(_fused_forward, dynamic=True)
    grad = torch.compile(_fused_grad, dynamic=True)

    def forward_any(
        logits_cv: torch.Tensor, ids_c: torch.Tensor, temperature: float, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        logp_c, entropy_c = forward(logits_cv, ids_c, temperature)
        return logp_c, entropy_c if with_entropy else None

    def grad_any(
        logits_cv: torch.Tensor,
        ids_c: torch.Tensor,
        temperature: float,
        g_logp_c: torch.Tensor | None,
        g_entropy_c: torch.Tensor | None,
        entropy_c: torch.Tensor,
        never_v: torch.Tensor | None,
    ) -> torch.Tensor:
        # one graph whatever is absent: a zero term costs a fused pass nothing
        zero_c = torch.zeros_like(entropy_c)
        if never_v is None:
            never_v = _no_tokens(logits_cv.shape[-1], logits_cv.device)
        return grad(
            logits_cv,
            ids_c,
            temperature,
            zero_c if g_logp_c is None else g_logp_c,
            zero_c if g_entropy_c is None else g_entropy_c,
            entropy_c,
            never_v,
        )

    return ChunkKernels(forward_any, grad_any, compiled=True)


@functools.lru_cache(maxsize=4)
def _no_tokens(vocab: int, device: torch.device) -> torch.Tensor:
    """An all-false token mask, made once rather than at every chunk."""
    return torch.zeros(vocab, dtype=torch.bool, device=device)


def kernels(compiled: bool) -> ChunkKernels:
    return compiled_kernels() if compiled else EAGER
