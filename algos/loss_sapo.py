"""SAPO, soft adaptive policy optimisation (Gao et al. 2025, arXiv 2511.20347): a smooth
gate on the ratio in place of PPO's hard clip.

Shapes: b = samples, t = response tokens.
"""

from __future__ import annotations

import torch

from rlpost.algos.aggregation import LossNorm, Metrics, aggregate, masked_mean
from rlpost.algos.config import PolicyLossConfig
from rlpost.algos.policy_loss import register_policy_loss


@register_policy_loss("sapo")
def sapo_loss(
    logp_bt: torch.Tensor,
    old_logp_bt: torch.Tensor,
    adv_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    cfg: PolicyLossConfig,
    norm: LossNorm,
) -> tuple[torch.Tensor, Metrics]:
    """loss_t = -f(r_t, tau_t) * A_t with f(r, tau) = sigmoid(tau (r - 1)) * 4 / tau,
    tau_t = tau_pos where A_t > 0 else tau_neg (verl's ``sapo``: the same keys and defaults,
    1.0 and 1.05).

    d f / d logp = 4 sigma (1 - sigma) r, which is 1 at r = 1: on-policy the gradient is the
    plain policy gradient, and it fades smoothly as r leaves 1 (faster for larger tau)
    instead of dropping to 0 at a clip bound. tau_neg > tau_pos damps negative updates more,
    which the paper finds steadier. The paper averages tokens within a sequence, i.e.
    ``agg="seq-mean-token-mean"`` (verl forces it; here the sapo preset sets it).
    Metrics: actor/pg_clipfrac and actor/pg_clipfrac_lower are 0 (nothing is clipped),
    actor/gate_mean (mean f), actor/ppo_kl, actor/ratio_mean, actor/pg_loss.
    """
    log_ratio_bt = torch.clamp(logp_bt - old_logp_bt, -cfg.log_ratio_clamp, cfg.log_ratio_clamp)
    ratio_bt = torch.exp(log_ratio_bt)
    tau_bt = torch.where(adv_bt > 0, cfg.tau_pos, cfg.tau_neg).to(ratio_bt.dtype)
    gate_bt = torch.sigmoid(tau_bt * (ratio_bt - 1.0)) * (4.0 / tau_bt)
    loss = aggregate(-gate_bt * adv_bt, mask_bt, cfg.agg, norm)
    with torch.no_grad():
        metrics = {
            "actor/pg_loss": loss.detach(),
            "actor/pg_clipfrac": loss.new_zeros(()),
            "actor/pg_clipfrac_lower": loss.new_zeros(()),
            "actor/gate_mean": masked_mean(gate_bt, mask_bt).detach(),
            "actor/ppo_kl": masked_mean(-log_ratio_bt, mask_bt).detach(),
            "actor/ratio_mean": masked_mean(ratio_bt, mask_bt).detach(),
        }
    return loss, metrics
