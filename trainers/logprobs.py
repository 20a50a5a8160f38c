"""Per-token log-probs and entropies from logits, a few tokens at a time.

Legend: b = samples, t = tokens, v = vocab, n = tokens of a flattened (b, t).

``log_softmax(logits.float())`` materialises a float32 [b, t, v] tensor and
autograd keeps it for the backward pass; the division by the temperature, the
gather's backward and the entropy's softmax each add another. At a 150k
vocabulary that is 2.4 GB per 4,096 tokens, every time. Here the forward pass
walks over chunks of tokens and keeps only two floats per token (the
log-normaliser and the mean logit); the backward pass recomputes each chunk's
softmax from the logits, which the graph holds anyway, and writes the
gradient chunk by chunk. Peak memory is the logits and their gradient, both
in the model's dtype, plus one chunk's float32 temporaries
(``bench/logprob_memory.py``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

# float32 elements of a chunk's temporaries (16 MiB each, two at a time): 27 tokens
# at a 150k vocabulary, the whole batch at a small one.
CHUNK_ELEMENTS = 1 << 22


def _shifted(
    logits_cv: torch.Tensor, temperature: float, max_c: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(z - m, m) for z = float32 logits / T and m = max_v z (or the given ``max_c``),
    in a new tensor: the only chunk-sized allocation besides exp(z - m).

    A -inf logit becomes the lowest float: its p is still 0, and p * (z - m) stays 0
    instead of 0 * inf = NaN in the entropy.
    """
    z_cv = logits_cv.float() / temperature
    z_cv.clamp_(min=torch.finfo(torch.float32).min)
    if max_c is None:
        max_c = z_cv.max(dim=-1).values
    return z_cv.sub_(max_c[:, None]), max_c


def _dot(x_cv: torch.Tensor, y_cv: torch.Tensor) -> torch.Tensor:
    """sum_v x * y per row, without a chunk-sized product."""
    return torch.bmm(x_cv[:, None, :], y_cv[:, :, None])[:, 0, 0]


class _TokenStats(torch.autograd.Function):
    """(logits_nv, next_ids_n) -> (logp_n, entropy_n) of softmax(logits / temperature).

    With z = logits / T, m = max_v z and log_s = log sum_v exp(z - m), as
    ``log_softmax`` computes it: logp = (z[id] - m) - log_s, p = exp(z - m - log_s)
    and H = log_s - sum_v p_v (z_v - m). Gradients: d logp / dz = onehot(id) - p and
    dH / dz = p (E_p[z] - z), both times 1/T for the logits.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        logits_nv: torch.Tensor,
        ids_n: torch.Tensor,
        temperature: float,
        with_entropy: bool,
        chunk: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = logits_nv.shape[0]
        logp_n = torch.empty(n, dtype=torch.float32, device=logits_nv.device)
        max_n, log_s_n = torch.empty_like(logp_n), torch.empty_like(logp_n)
        mean_zm_n = torch.empty_like(logp_n) if with_entropy else logp_n.new_zeros(0)
        for s in range(0, n, chunk):
            rows = slice(s, s + chunk)
            zm_cv, max_n[rows] = _shifted(logits_nv[rows], temperature)
            e_cv = zm_cv.exp()
            sum_c = e_cv.sum(-1)
            log_s_n[rows] = sum_c.log()
            logp_n[rows] = zm_cv.gather(-1, ids_n[rows, None])[:, 0] - log_s_n[rows]
            if with_entropy:
                mean_zm_n[rows] = _dot(e_cv.div_(sum_c[:, None]), zm_cv)  # e becomes p
        entropy_n = log_s_n - mean_zm_n if with_entropy else torch.zeros_like(logp_n)
        ctx.save_for_backward(logits_nv, ids_n, max_n, log_s_n, mean_zm_n)
        ctx.temperature, ctx.with_entropy, ctx.chunk = temperature, with_entropy, chunk
        ctx.set_materialize_grads(False)
        if not with_entropy:
            ctx.mark_non_differentiable(entropy_n)
        return logp_n, entropy_n

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any,
        g_logp_n: torch.Tensor | None,
        g_entropy_n: torch.Tensor | None,
    ) -> tuple[torch.Tensor | None, None, None, None, None]:
        logits_nv, ids_n, max_n, log_s_n, mean_zm_n = ctx.saved_tensors
        temperature, chunk = ctx.temperature, ctx.chunk
        if not ctx.with_entropy:
            g_entropy_n = None
        if g_logp_n is None and g_entropy_n is None:
            return None, None, None, None, None
        grad_nv = torch.empty_like(logits_nv)
        for s in range(0, logits_nv.shape[0], chunk):
            rows = slice(s, s + chunk)
            zm_cv, _ = _shifted(logits_nv[rows], temperature, max_n[rows])
            g_cv = (zm_cv - log_s_n[rows, None]).exp_()  # p, then the gradient in place
            if g_entropy_n is not None:  # zm becomes g_H * p * (E_p[z - m] - (z - m))
                zm_cv.neg_().add_(mean_zm_n[rows, None]).mul_(g_cv)
                zm_cv.mul_(g_entropy_n[rows, None])
            if g_logp_n is None:
                g_cv = zm_cv
            else:
                g_cv.mul_(-g_logp_n[rows, None])
                g_cv.scatter_add_(-1, ids_n[rows, None], g_logp_n[rows, None])
                if g_entropy_n is not None:
                    g_cv.add_(zm_cv)
            grad_nv[rows] = g_cv.div_(temperature)
        return grad_nv, None, None, None, None


def token_logprobs_and_entropy(
    logits_btv: torch.Tensor,
    input_ids_bt: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = True,
    chunk_elements: int = CHUNK_ELEMENTS,
    plain_elements: int = CHUNK_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logp_bt, entropy_bt)`` of ``softmax(logits / temperature)``, float32, aligned
    with ``input_ids_bt``: position t holds log p(token_t | tokens_<t) and the entropy
    of that prediction; position 0 is 0 in both.

    The same values and gradients as ``log_softmax`` + ``gather`` and
    ``algos.entropy_from_logits`` on the float32 logits, without their [b, t, v]
    float32 intermediates. ``with_entropy=False`` skips the entropy (returned as
    zeros, without gradient). Logits of at most ``plain_elements`` elements (a small
    vocabulary, as the built-in models have) take the plain path, whose float32
    rounding the built-in model's cached warm-up was made with.
    """
    b, t, v = logits_btv.shape
    if b * t * v <= plain_elements:  # small enough to hold whole: the plain computation
        # over positions 0..t-2 exactly as before (the cached warm-ups' rounding)
        logp_bt, entropy_bt = _plain(
            logits_btv[:, :-1], input_ids_bt[:, 1:], temperature, with_entropy
        )
        return F.pad(logp_bt, (1, 0)), F.pad(entropy_bt, (1, 0))
    next_ids_bt = F.pad(input_ids_bt[:, 1:], (0, 1))  # the last position predicts nothing
    logp_bt, entropy_bt = next_token_stats(
        logits_btv, next_ids_bt, temperature, with_entropy, chunk_elements, plain_elements
    )
    return F.pad(logp_bt[:, :-1], (1, 0)), F.pad(entropy_bt[:, :-1], (1, 0))


def next_token_stats(
    logits_btv: torch.Tensor,
    next_ids_bt: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = True,
    chunk_elements: int = CHUNK_ELEMENTS,
    plain_elements: int = CHUNK_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``token_logprobs_and_entropy`` before its shift: position t holds
    log p(next_ids_t | logits_t) and the entropy of the logits at t. A slice of a
    sequence (``trainer.ulysses``) predicts its next slice's first token too."""
    b, t, v = logits_btv.shape
    if b * t * v <= plain_elements:  # small enough to hold whole: the plain computation
        return _plain(logits_btv, next_ids_bt, temperature, with_entropy)
    chunk = max(1, chunk_elements // v)
    logp_n, entropy_n = _TokenStats.apply(
        logits_btv.reshape(b * t, v), next_ids_bt.reshape(-1), temperature, with_entropy, chunk
    )
    return logp_n.view(b, t), entropy_n.view(b, t)


def _plain(
    logits_btv: torch.Tensor, next_ids_bt: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``next_token_stats`` by ``log_softmax`` over the whole float32 tensor: for
    batches whose logits fit one chunk, where chunking saves nothing."""
    from rlpost.algos import entropy_from_logits

    z_btv = (logits_btv.float() / temperature).clamp(min=torch.finfo(torch.float32).min)
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
