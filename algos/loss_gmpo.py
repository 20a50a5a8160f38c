"""GMPO, geometric-mean policy optimisation (Zhao et al. 2025, arXiv 2507.20673): the
sequence objective uses the geometric mean of the token ratios, which an outlier token
moves far less than the arithmetic mean GRPO's token average amounts to.

Shapes: b = samples, t = response tokens.
"""

from __future__ import annotations

import torch

from rlpost.algos.aggregation import LossNorm, Metrics, aggregate, masked_mean
from rlpost.algos.config import PolicyLossConfig
from rlpost.algos.policy_loss import register_policy_loss


@register_policy_loss("geo_mean")
def gmpo_loss(
    logp_bt: torch.Tensor,
    old_logp_bt: torch.Tensor,
    adv_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    cfg: PolicyLossConfig,
    norm: LossNorm,
) -> tuple[torch.Tensor, Metrics]:
    """pg_i = -A_i * exp(mean_t l_i,t), with the token log-ratio clipped pessimistically in
    log space: l_t = sign(A) min(sign(A) x_t, sign(A) clamp(x_t, -clip_low, clip_high)),
    x_t = logp_t - old_t, sign(A) that of the token's advantage (as verl; a token an
    off-policy correction rejected, A_t = 0, adds l_t = 0). A_i is the mean of the sample's
    token advantages (GMPO is for sequence-level advantages).

    The keys are verl's ``geo_mean`` (also registered as ``gmpo``): clip_low/clip_high are
    bounds on the log-ratio, the paper's range is (-0.4, 0.4), i.e. ratios in
    (e^-0.4, e^0.4). Every response token carries its sample's pg_i, so
    ``agg="seq-mean-token-mean"`` gives the paper's mean over sequences (verl's form);
    token-mean weighs each sequence by its length. d pg_i / d logp_t = -A_i s_i / n_i on
    the tokens whose log-ratio is not clipped (s_i the geometric-mean ratio).
    Metrics: actor/pg_clipfrac (tokens whose clip is active), actor/pg_clipfrac_lower
    (0: no dual clip), actor/ratio_mean (of s_i over tokens), actor/ppo_kl, actor/pg_loss.
    """
    mask_bt = mask_bt.to(logp_bt.dtype)
    log_ratio_bt = torch.clamp(logp_bt - old_logp_bt, -cfg.log_ratio_clamp, cfg.log_ratio_clamp)
    n_b = mask_bt.sum(-1).clamp(min=1)
    adv_b = (adv_bt * mask_bt).sum(-1) / n_b
    sign_bt = torch.sign(adv_bt)
    clamped_bt = torch.clamp(log_ratio_bt, -cfg.clip_low, cfg.clip_high)
    pess_bt = sign_bt * torch.minimum(sign_bt * log_ratio_bt, sign_bt * clamped_bt)
    seq_ratio_b = torch.exp((pess_bt * mask_bt).sum(-1) / n_b)
    pg_bt = (-adv_b * seq_ratio_b)[:, None].expand_as(logp_bt)
    loss = aggregate(pg_bt, mask_bt, cfg.agg, norm)
    with torch.no_grad():
        clipped_bt = (sign_bt * clamped_bt < sign_bt * log_ratio_bt).float()
        metrics = {
            "actor/pg_loss": loss.detach(),
            "actor/pg_clipfrac": masked_mean(clipped_bt, mask_bt).detach(),
            "actor/pg_clipfrac_lower": loss.new_zeros(()),
            "actor/ppo_kl": masked_mean(-log_ratio_bt, mask_bt).detach(),
            "actor/ratio_mean": masked_mean(
                seq_ratio_b[:, None].expand_as(mask_bt), mask_bt
            ).detach(),
        }
    return loss, metrics


register_policy_loss("gmpo")(gmpo_loss)
