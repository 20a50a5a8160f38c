"""Policy-gradient losses. Each returns ``(loss, metrics)``; ``loss`` is this micro-batch's
share of the global-batch loss (see ``rlpost.algos.aggregation``), ``metrics`` are 0-d tensors
over this micro-batch's response tokens (``Metrics``: the update reads them once per step).

Shapes: b = samples, t = response tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlpost.algos.aggregation import LossNorm, Metrics, aggregate, masked_mean
from rlpost.algos.config import PolicyLossConfig

PolicyLossFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, PolicyLossConfig, LossNorm],
    tuple[torch.Tensor, Metrics],
]
POLICY_LOSSES: dict[str, PolicyLossFn] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator adding a loss with ``ppo_clip_loss``'s signature to ``POLICY_LOSSES``."""

    def deco(fn: PolicyLossFn) -> PolicyLossFn:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is already registered")
        POLICY_LOSSES[name] = fn
        return fn

    return deco


def build_policy_loss(cfg: PolicyLossConfig) -> PolicyLossFn:
    """The loss function named by ``cfg.name``."""
    if cfg.name not in POLICY_LOSSES:
        raise KeyError(f"unknown policy loss {cfg.name!r}; choose one of {sorted(POLICY_LOSSES)}")
    return POLICY_LOSSES[cfg.name]


def _clipped_pg(
    log_ratio_bt: torch.Tensor,
    adv_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    cfg: PolicyLossConfig,
    norm: LossNorm,
) -> tuple[torch.Tensor, Metrics]:
    """Clipped surrogate on a (clamped) log-ratio, shared by PPO and GSPO.

    pg = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))   (Schulman et al. 2017, eq. 7)
    for A < 0 and clip_c set: pg = min(pg, -A clip_c)         (Ye et al. 2020, dual clip)
    """
    ratio_bt = torch.exp(log_ratio_bt)
    pg1_bt = -adv_bt * ratio_bt
    pg2_bt = -adv_bt * torch.clamp(ratio_bt, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    pg_bt = torch.maximum(pg1_bt, pg2_bt)
    clipped_bt = (pg2_bt > pg1_bt).to(ratio_bt.dtype)
    lower_bt = torch.zeros_like(ratio_bt)
    if cfg.clip_c is not None:
        pg3_bt = -adv_bt * cfg.clip_c
        neg_bt = adv_bt < 0
        lower_bt = (neg_bt & (pg_bt > pg3_bt)).to(ratio_bt.dtype)
        pg_bt = torch.where(neg_bt, torch.minimum(pg_bt, pg3_bt), pg_bt)
    loss = aggregate(pg_bt, mask_bt, cfg.agg, norm)
    with torch.no_grad():
        metrics = {
            "actor/pg_loss": loss.detach(),
            "actor/pg_clipfrac": masked_mean(clipped_bt, mask_bt).detach(),
            "actor/pg_clipfrac_lower": masked_mean(lower_bt, mask_bt).detach(),
            "actor/ppo_kl": masked_mean(-log_ratio_bt, mask_bt).detach(),
            "actor/ratio_mean": masked_mean(ratio_bt, mask_bt).detach(),
        }
    return loss, metrics


@register_policy_loss("ppo_clip")
def ppo_clip_loss(
    logp_bt: torch.Tensor,
    old_logp_bt: torch.Tensor,
    adv_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    cfg: PolicyLossConfig,
    norm: LossNorm,
) -> tuple[torch.Tensor, Metrics]:
    """Token-level clipped PPO surrogate (Schulman et al. 2017, eq. 7), r_t = exp(logp - old).

    GRPO is this loss with a group-normalised advantage; DAPO's clip-higher is
    ``clip_high > clip_low``; ``clip_c`` adds the dual clip for A < 0. The log-ratio is
    clamped to +-``log_ratio_clamp`` before ``exp`` so a stale token cannot overflow.
    Metrics: actor/pg_clipfrac, actor/pg_clipfrac_lower (dual-clip hits), actor/ppo_kl
    (mean of old - new), actor/ratio_mean, actor/pg_loss (this micro-batch's loss).
    """
    log_ratio_bt = torch.clamp(logp_bt - old_logp_bt, -cfg.log_ratio_clamp, cfg.log_ratio_clamp)
    return _clipped_pg(log_ratio_bt, adv_bt, mask_bt, cfg, norm)


@register_policy_loss("gspo")
def gspo_loss(
    logp_bt: torch.Tensor,
    old_logp_bt: torch.Tensor,
    adv_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    cfg: PolicyLossConfig,
    norm: LossNorm,
) -> tuple[torch.Tensor, Metrics]:
    """Group Sequence Policy Optimisation (Zheng et al. 2025, eq. 5-7 and GSPO-token eq. 13).

    s_i = exp(mean_t(logp - old_logp)) over sample i's response tokens; token form
    s_i,t = sg[s_i] * exp(logp_t - sg[logp_t]), whose value is s_i and whose gradient per
    token is that of the sequence ratio (the 1/|y_i| arrives through the aggregation).
    Clipped like PPO with clip_low/clip_high. The paper's objective averages tokens within
    a sequence, i.e. ``agg="seq-mean-token-mean"``, which the gspo algo config must set.
    """
    mask_bt = mask_bt.to(logp_bt.dtype)
    n_b = mask_bt.sum(-1).clamp(min=1)
    seq_log_ratio_b = ((logp_bt - old_logp_bt) * mask_bt).sum(-1) / n_b
    log_ratio_bt = seq_log_ratio_b.detach()[:, None] + logp_bt - logp_bt.detach()
    log_ratio_bt = torch.clamp(log_ratio_bt, -cfg.log_ratio_clamp, cfg.log_ratio_clamp)
    return _clipped_pg(log_ratio_bt, adv_bt, mask_bt, cfg, norm)


def sft_loss(
    logp_bt: torch.Tensor, mask_bt: torch.Tensor, norm: LossNorm
) -> tuple[torch.Tensor, Metrics]:
    """Negative log-likelihood, -sum(logp * mask) / global_tokens (token-mean over the
    global batch). Metric ``sft/nll``: mean NLL over this micro-batch's mask tokens."""
    loss = aggregate(-logp_bt, mask_bt, "token-mean", norm)
    with torch.no_grad():
        nll = masked_mean(-logp_bt, mask_bt)
    return loss, {"sft/nll": nll}
