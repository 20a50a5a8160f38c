"""Covariance-based entropy control, Clip-Cov and KL-Cov (Cui et al. 2025, "The Entropy
Mechanism of Reinforcement Learning for Reasoning Language Models", arXiv 2505.22617):
entropy falls fastest through tokens whose log-probability and advantage
covary most, so a small share of such tokens is held back.

Shapes: b = samples, t = response tokens.

Both centre over the response tokens the loss receives, one micro-batch (as verl, whose
loss sees one micro-batch too): cov_t = (A_t - mean A) * (logp_t - mean logp), detached.
"""

from __future__ import annotations

import torch

from rlpost.algos.aggregation import LossNorm, Metrics, aggregate, masked_mean
from rlpost.algos.config import PolicyLossConfig
from rlpost.algos.policy_loss import register_policy_loss


def token_covariance(
    logp_bt: torch.Tensor, adv_bt: torch.Tensor, mask_bt: torch.Tensor
) -> torch.Tensor:
    """cov_t = (A_t - mean A) (logp_t - mean logp), means over mask tokens; detached,
    -inf outside the mask (so a top-k never picks a padding token)."""
    logp_bt = logp_bt.detach()
    centred_bt = (adv_bt - masked_mean(adv_bt, mask_bt)) * (logp_bt - masked_mean(logp_bt, mask_bt))
    return torch.where(mask_bt.bool(), centred_bt, torch.full_like(centred_bt, -torch.inf))


def _top_k_mask(score_bt: torch.Tensor, eligible_bt: torch.Tensor, k: int) -> torch.Tensor:
    """1.0 at the (at most) k eligible positions with the largest score, else 0."""
    flat = torch.where(eligible_bt, score_bt, torch.full_like(score_bt, -torch.inf)).reshape(-1)
    k = min(k, int(eligible_bt.sum().item()))
    picked = torch.zeros_like(flat)
    if k > 0:
        picked[torch.topk(flat, k).indices] = 1.0
    return picked.reshape(score_bt.shape)


def _metrics(
    loss: torch.Tensor,
    log_ratio_bt: torch.Tensor,
    clipped_bt: torch.Tensor,
    picked_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    picked_name: str,
) -> Metrics:
    with torch.no_grad():
        return {
            "actor/pg_loss": loss.detach(),
            "actor/pg_clipfrac": masked_mean(clipped_bt, mask_bt).detach(),
            "actor/pg_clipfrac_lower": loss.new_zeros(()),
            picked_name: masked_mean(picked_bt, mask_bt),
            "actor/ppo_kl": masked_mean(-log_ratio_bt, mask_bt).detach(),
            "actor/ratio_mean": masked_mean(torch.exp(log_ratio_bt), mask_bt).detach(),
        }


@register_policy_loss("clip_cov")
def clip_cov_loss(
    logp_bt: torch.Tensor,
    old_logp_bt: torch.Tensor,
    adv_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    cfg: PolicyLossConfig,
    norm: LossNorm,
) -> tuple[torch.Tensor, Metrics]:
    """Clip-Cov: the clipped PPO loss (clip_low/clip_high, no dual clip:
    ``clip_c`` is not read), with the loss and gradient of k = max(1, int(clip_cov_ratio * N))
    tokens dropped (N: response tokens), chosen among those the PPO clip left active whose
    covariance lies in (clip_cov_lb, clip_cov_ub). Keys and defaults as verl's ``clip_cov``
    (2e-4, 1, 5).

    Deterministic choice: the paper and verl draw the k tokens at random from the band;
    here they are the k with the largest covariance inside it, so a run and its tests
    repeat exactly. Metrics: actor/pg_clipfrac (PPO clip active), actor/clip_cov_frac
    (tokens dropped), actor/ppo_kl, actor/ratio_mean, actor/pg_loss.
    """
    mask_bt = mask_bt.to(logp_bt.dtype)
    log_ratio_bt = torch.clamp(logp_bt - old_logp_bt, -cfg.log_ratio_clamp, cfg.log_ratio_clamp)
    ratio_bt = torch.exp(log_ratio_bt)
    pg1_bt = -adv_bt * ratio_bt
    pg2_bt = -adv_bt * torch.clamp(ratio_bt, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    clipped_bt = ((pg2_bt > pg1_bt) & mask_bt.bool()).to(logp_bt.dtype)
    cov_bt = token_covariance(logp_bt, adv_bt, mask_bt)
    band_bt = (cov_bt > cfg.clip_cov_lb) & (cov_bt < cfg.clip_cov_ub) & ~clipped_bt.bool()
    k = max(int(cfg.clip_cov_ratio * mask_bt.sum().item()), 1)
    dropped_bt = _top_k_mask(cov_bt, band_bt & mask_bt.bool(), k)
    pg_bt = torch.maximum(pg1_bt, pg2_bt) * (1.0 - dropped_bt)
    loss = aggregate(pg_bt, mask_bt, cfg.agg, norm)
    return loss, _metrics(
        loss, log_ratio_bt, clipped_bt, dropped_bt, mask_bt, "actor/clip_cov_frac"
    )


@register_policy_loss("kl_cov")
def kl_cov_loss(
    logp_bt: torch.Tensor,
    old_logp_bt: torch.Tensor,
    adv_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    cfg: PolicyLossConfig,
    norm: LossNorm,
) -> tuple[torch.Tensor, Metrics]:
    """KL-Cov: the unclipped surrogate -A_t r_t on every token, plus
    ppo_kl_coef * |logp_t - old_t| on the k = max(1, int(kl_cov_ratio * N)) tokens with the
    largest covariance (top-k, deterministic as in the paper and verl). Keys and defaults
    as verl's ``kl_cov`` (2e-4, 1.0); |log r| is verl's form of the KL term. Ties in the
    covariance are broken by ``torch.topk``.
    Metrics: actor/pg_clipfrac (0: no clip), actor/kl_cov_frac (tokens with the KL term),
    actor/ppo_kl, actor/ratio_mean, actor/pg_loss.
    """
    mask_bt = mask_bt.to(logp_bt.dtype)
    log_ratio_bt = torch.clamp(logp_bt - old_logp_bt, -cfg.log_ratio_clamp, cfg.log_ratio_clamp)
    ratio_bt = torch.exp(log_ratio_bt)
    cov_bt = token_covariance(logp_bt, adv_bt, mask_bt)
    k = max(int(cfg.kl_cov_ratio * mask_bt.sum().item()), 1)
    picked_bt = _top_k_mask(cov_bt, mask_bt.bool(), k)
    pg_bt = -adv_bt * ratio_bt + picked_bt * cfg.ppo_kl_coef * log_ratio_bt.abs()
    loss = aggregate(pg_bt, mask_bt, cfg.agg, norm)
    return loss, _metrics(
        loss, log_ratio_bt, torch.zeros_like(mask_bt), picked_bt, mask_bt, "actor/kl_cov_frac"
    )
