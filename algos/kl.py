"""KL estimators between the policy and a reference, and KL-coefficient controllers.

Shapes: b = samples, t = response tokens.
"""

from __future__ import annotations

import torch

from rlpost.algos.config import KL_KINDS


def kl_penalty(logp_bt: torch.Tensor, ref_logp_bt: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from sampled tokens, d = logp - ref_logp.

    k1: d ; k2: d^2 / 2 ; k3: exp(-d) + d - 1 (unbiased, always >= 0; Schulman 2020,
    "Approximating KL divergence", used by GRPO eq. 4) ; abs: |d|.
    For k3, d is clamped to +-20 before ``exp`` so one stale token cannot give inf.
    """
    d_bt = logp_bt - ref_logp_bt
    if kind == "k1":
        return d_bt
    if kind == "k2":
        return 0.5 * d_bt.square()
    if kind == "k3":
        d_bt = d_bt.clamp(-20.0, 20.0)
        return torch.exp(-d_bt) + d_bt - 1.0
    if kind == "abs":
        return d_bt.abs()
    raise KeyError(f"unknown KL estimator {kind!r}; choose one of {list(KL_KINDS)}")


class FixedKLController:
    """A constant KL coefficient."""

    def __init__(self, init_coef: float) -> None:
        self.value = float(init_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient is fixed."""


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, "Fine-Tuning Language Models from
    Human Preferences", sec. 2.2):

    e = clip(KL / target - 1, -0.2, 0.2) ;  beta <- beta * (1 + e * n_steps / horizon)
    """

    def __init__(self, init_coef: float, target: float, horizon: float) -> None:
        if not target > 0 or not horizon > 0:
            raise ValueError(f"target={target} and horizon={horizon} must both be > 0")
        self.value = float(init_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move the coefficient towards keeping ``current_kl`` near ``target``;
        ``n_steps`` is the number of samples (or steps) since the last update."""
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


def kl_reward_penalty(
    scores_b: torch.Tensor,
    logp_bt: torch.Tensor,
    ref_logp_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    coef: float,
    kind: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """KL as a reward penalty (Ziegler et al. 2019; Ouyang et al. 2022, eq. 2).

    Returns ``(token_rewards_bt, penalised_scores_b, kl_b)``: the score on each
    sample's last response token minus ``coef * kl_t`` on every response token
    (for token-level estimators such as GAE), the score minus ``coef * sum_t kl_t``
    (for sample-level estimators such as GRPO), and the per-sample KL sum.
    """
    mask_bt = mask_bt.to(logp_bt.dtype)
    kl_bt = kl_penalty(logp_bt, ref_logp_bt, kind) * mask_bt
    kl_b = kl_bt.sum(dim=1)
    last_bt = torch.zeros_like(mask_bt)
    has_tokens_b = mask_bt.sum(dim=1) > 0
    positions_t = torch.arange(mask_bt.shape[1], device=mask_bt.device)
    last_b = (mask_bt * positions_t).argmax(dim=1)
    last_bt[has_tokens_b, last_b[has_tokens_b]] = 1.0
    token_rewards_bt = last_bt * scores_b.unsqueeze(1) - coef * kl_bt
    return token_rewards_bt, scores_b - coef * kl_b, kl_b
