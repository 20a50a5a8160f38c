"""Critic loss and diagnostics for PPO with a value model.

Shapes: b = samples, t = response tokens.
"""

from __future__ import annotations

import torch

from rlpost.algos.aggregation import LossNorm, Metrics, aggregate, masked_mean


def clipped_value_loss(
    values_bt: torch.Tensor,
    old_values_bt: torch.Tensor,
    returns_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    *,
    clip: float,
    agg: str,
    norm: LossNorm,
) -> tuple[torch.Tensor, Metrics]:
    """Clipped value loss (PPO2 baselines; Andrychowicz et al. 2021, sec. 3.2 "value clipping"):

    0.5 * max((V - R)^2, (clip(V, V_old - clip, V_old + clip) - R)^2), aggregated by ``agg``.
    Metrics over this micro-batch's mask tokens: critic/vf_loss (mean per-token loss),
    critic/vf_clipfrac (fraction where the clipped term is larger).
    """
    clipped_bt = old_values_bt + torch.clamp(values_bt - old_values_bt, -clip, clip)
    l1_bt = (values_bt - returns_bt).square()
    l2_bt = (clipped_bt - returns_bt).square()
    loss_bt = 0.5 * torch.maximum(l1_bt, l2_bt)
    loss = aggregate(loss_bt, mask_bt, agg, norm)
    with torch.no_grad():
        metrics = {
            "critic/vf_loss": masked_mean(loss_bt, mask_bt).detach(),
            "critic/vf_clipfrac": masked_mean((l2_bt > l1_bt).to(loss_bt.dtype), mask_bt).detach(),
        }
    return loss, metrics


@torch.no_grad()
def explained_variance(
    values_bt: torch.Tensor, returns_bt: torch.Tensor, mask_bt: torch.Tensor
) -> float:
    """1 - Var[R - V] / Var[R] over mask tokens (population variances); 1 is a perfect
    critic, 0 no better than a constant. NaN when Var[R] = 0 (undefined), as cleanrl."""
    mask_bt = mask_bt.to(values_bt.dtype)
    n = mask_bt.sum().clamp(min=1)

    def var(x_bt: torch.Tensor) -> torch.Tensor:
        mean = (x_bt * mask_bt).sum() / n
        return (((x_bt - mean) * mask_bt) ** 2).sum() / n

    var_r = var(returns_bt)
    if var_r.item() == 0.0:
        return float("nan")
    return (1.0 - var(returns_bt - values_bt) / var_r).item()
