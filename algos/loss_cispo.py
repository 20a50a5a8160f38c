"""CISPO, clipped importance-sampling-weight policy optimisation (MiniMax 2025,
"MiniMax-M1", arXiv 2506.13585, sec. 3.1).

Shapes: b = samples, t = response tokens.
"""

from __future__ import annotations

import torch

from rlpost.algos.aggregation import LossNorm, Metrics, aggregate, masked_mean
from rlpost.algos.config import PolicyLossConfig
from rlpost.algos.policy_loss import register_policy_loss


@register_policy_loss("cispo")
def cispo_loss(
    logp_bt: torch.Tensor,
    old_logp_bt: torch.Tensor,
    adv_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    cfg: PolicyLossConfig,
    norm: LossNorm,
) -> tuple[torch.Tensor, Metrics]:
    """loss_t = -sg(clip(r_t, 1 - clip_low, 1 + clip_high)) * A_t * logp_t, r_t = exp(logp - old).

    PPO's clip zeroes the gradient of a token whose ratio left the band, which in practice
    drops the rare, high-entropy tokens ("However", "Wait") after their first update. CISPO
    clips the importance weight instead and stops its gradient, so every token keeps a
    REINFORCE gradient -w_t A_t grad(logp_t), scaled by the bounded weight w_t. The paper
    sets no lower bound (``clip_low = 1``, so the lower end is 0) and tunes only ``clip_high``;
    verl's ``cispo`` reads the same two bounds (``clip_ratio_low``/``clip_ratio_high``).
    Metrics: actor/pg_clipfrac (weights cut at the upper bound), actor/pg_clipfrac_lower (at
    the lower bound), actor/ppo_kl, actor/ratio_mean, actor/pg_loss.
    """
    log_ratio_bt = torch.clamp(logp_bt - old_logp_bt, -cfg.log_ratio_clamp, cfg.log_ratio_clamp)
    ratio_bt = torch.exp(log_ratio_bt)
    weight_bt = torch.clamp(ratio_bt, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high).detach()
    loss = aggregate(-weight_bt * adv_bt * logp_bt, mask_bt, cfg.agg, norm)
    with torch.no_grad():
        metrics = {
            "actor/pg_loss": loss.detach(),
            "actor/pg_clipfrac": masked_mean(
                (ratio_bt > 1.0 + cfg.clip_high).float(), mask_bt
            ).detach(),
            "actor/pg_clipfrac_lower": masked_mean(
                (ratio_bt < 1.0 - cfg.clip_low).float(), mask_bt
            ).detach(),
            "actor/ppo_kl": masked_mean(-log_ratio_bt, mask_bt).detach(),
            "actor/ratio_mean": masked_mean(ratio_bt, mask_bt).detach(),
        }
    return loss, metrics
