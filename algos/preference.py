"""Pairwise preference losses: DPO and its variants, and the Bradley-Terry loss of a
reward model. Each returns ``(loss, metrics)``; ``loss`` is this micro-batch's share
of the global-batch mean over pairs, and so is every metric (the trainer adds the
shares of every micro-batch and rank), so a step's figures are means over its
pairs whatever the split.

Shapes: p = pairs (chosen and rejected of one prompt).

Inputs are one number per completion: its summed response log-prob (DPO, IPO,
hinge), or its mean log-prob per response token (``length_normalised`` losses:
SimPO, ORPO), under the policy and, for losses that need it, under the frozen
reference policy. Metrics follow TRL's names: ``rewards/chosen`` and
``rewards/rejected`` are the implicit rewards beta * (log pi - log pi_ref)
(beta * log pi for the reference-free losses), ``rewards/margins`` their
difference, ``rewards/accuracies`` the share of pairs whose chosen reward is the
higher, ``logps/chosen`` and ``logps/rejected`` the policy's log-probs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlpost.algos.aggregation import Metrics
from rlpost.algos.config import PreferenceConfig

PreferenceLossFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None, PreferenceConfig, float],
    tuple[torch.Tensor, Metrics],
]


@dataclass(frozen=True)
class PreferenceLoss:
    """A registered loss and what it takes: reference log-probs or none, and summed
    or per-token-mean log-probs."""

    fn: PreferenceLossFn
    needs_reference: bool
    length_normalised: bool


PREFERENCE_LOSSES: dict[str, PreferenceLoss] = {}


def register_preference_loss(
    name: str, *, needs_reference: bool = True, length_normalised: bool = False
) -> Callable[[PreferenceLossFn], PreferenceLossFn]:
    """Decorator adding a loss with ``dpo_sigmoid_loss``'s signature to ``PREFERENCE_LOSSES``."""

    def deco(fn: PreferenceLossFn) -> PreferenceLossFn:
        if name in PREFERENCE_LOSSES:
            raise ValueError(f"preference loss {name!r} is already registered")
        PREFERENCE_LOSSES[name] = PreferenceLoss(fn, needs_reference, length_normalised)
        return fn

    return deco


def build_preference_loss(cfg: PreferenceConfig) -> PreferenceLoss:
    """The loss named by ``cfg.loss``."""
    if cfg.loss not in PREFERENCE_LOSSES:
        raise KeyError(
            f"unknown preference loss {cfg.loss!r}; choose one of {sorted(PREFERENCE_LOSSES)}"
        )
    return PREFERENCE_LOSSES[cfg.loss]


def _share(x_p: torch.Tensor, num_pairs: float) -> torch.Tensor:
    """This micro-batch's share of the global mean over ``num_pairs`` pairs."""
    return x_p.sum() / max(float(num_pairs), 1.0)


def _pair_metrics(
    chosen_logp_p: torch.Tensor,
    rejected_logp_p: torch.Tensor,
    chosen_reward_p: torch.Tensor,
    rejected_reward_p: torch.Tensor,
    num_pairs: float,
) -> Metrics:
    with torch.no_grad():
        c, r = chosen_reward_p.detach(), rejected_reward_p.detach()
        return {
            "rewards/chosen": _share(c, num_pairs).detach(),
            "rewards/rejected": _share(r, num_pairs).detach(),
            "rewards/margins": _share(c - r, num_pairs).detach(),
            "rewards/accuracies": _share((c > r).float(), num_pairs).detach(),
            "logps/chosen": _share(chosen_logp_p.detach(), num_pairs).detach(),
            "logps/rejected": _share(rejected_logp_p.detach(), num_pairs).detach(),
        }


def _implicit_rewards(
    chosen_logp_p: torch.Tensor,
    rejected_logp_p: torch.Tensor,
    ref_chosen_logp_p: torch.Tensor | None,
    ref_rejected_logp_p: torch.Tensor | None,
    beta: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """beta * (log pi - log pi_ref) of chosen and rejected (Rafailov et al. 2023, sec. 5)."""
    if ref_chosen_logp_p is None or ref_rejected_logp_p is None:
        raise ValueError("this preference loss needs the reference policy's log-probs")
    return (
        beta * (chosen_logp_p - ref_chosen_logp_p),
        beta * (rejected_logp_p - ref_rejected_logp_p),
    )


@register_preference_loss("sigmoid")
def dpo_sigmoid_loss(
    chosen_logp_p: torch.Tensor,
    rejected_logp_p: torch.Tensor,
    ref_chosen_logp_p: torch.Tensor | None,
    ref_rejected_logp_p: torch.Tensor | None,
    cfg: PreferenceConfig,
    num_pairs: float,
) -> tuple[torch.Tensor, Metrics]:
    """DPO (Rafailov et al. 2023, eq. 7): -log sigma(r_c - r_r) with r = beta log(pi/pi_ref).

    With ``label_smoothing`` eps (conservative DPO, Mitchell 2023):
    -(1 - eps) log sigma(h) - eps log sigma(-h), h = r_c - r_r.
    """
    r_c, r_r = _implicit_rewards(
        chosen_logp_p, rejected_logp_p, ref_chosen_logp_p, ref_rejected_logp_p, cfg.beta
    )
    h_p = r_c - r_r
    eps = cfg.label_smoothing
    loss_p = -(1 - eps) * F.logsigmoid(h_p) - eps * F.logsigmoid(-h_p)
    return _share(loss_p, num_pairs), _pair_metrics(
        chosen_logp_p, rejected_logp_p, r_c, r_r, num_pairs
    )


@register_preference_loss("ipo")
def ipo_loss(
    chosen_logp_p: torch.Tensor,
    rejected_logp_p: torch.Tensor,
    ref_chosen_logp_p: torch.Tensor | None,
    ref_rejected_logp_p: torch.Tensor | None,
    cfg: PreferenceConfig,
    num_pairs: float,
) -> tuple[torch.Tensor, Metrics]:
    """IPO (Azar et al. 2023, eq. 17): (h - 1 / (2 beta))^2 with
    h = log(pi(y_c) / pi_ref(y_c)) - log(pi(y_r) / pi_ref(y_r)), beta the regulariser tau."""
    r_c, r_r = _implicit_rewards(
        chosen_logp_p, rejected_logp_p, ref_chosen_logp_p, ref_rejected_logp_p, cfg.beta
    )
    h_p = (r_c - r_r) / cfg.beta
    loss_p = (h_p - 1 / (2 * cfg.beta)) ** 2
    return _share(loss_p, num_pairs), _pair_metrics(
        chosen_logp_p, rejected_logp_p, r_c, r_r, num_pairs
    )


@register_preference_loss("hinge")
def hinge_loss(
    chosen_logp_p: torch.Tensor,
    rejected_logp_p: torch.Tensor,
    ref_chosen_logp_p: torch.Tensor | None,
    ref_rejected_logp_p: torch.Tensor | None,
    cfg: PreferenceConfig,
    num_pairs: float,
) -> tuple[torch.Tensor, Metrics]:
    """SLiC's rank-calibration hinge (Zhao et al. 2023, eq. 2) on the DPO log-ratio,
    as TRL's ``hinge``: max(0, 1 - (r_c - r_r)), r = beta log(pi / pi_ref)."""
    r_c, r_r = _implicit_rewards(
        chosen_logp_p, rejected_logp_p, ref_chosen_logp_p, ref_rejected_logp_p, cfg.beta
    )
    loss_p = torch.relu(1 - (r_c - r_r))
    return _share(loss_p, num_pairs), _pair_metrics(
        chosen_logp_p, rejected_logp_p, r_c, r_r, num_pairs
    )


@register_preference_loss("simpo", needs_reference=False, length_normalised=True)
def simpo_loss(
    chosen_logp_p: torch.Tensor,
    rejected_logp_p: torch.Tensor,
    ref_chosen_logp_p: torch.Tensor | None,
    ref_rejected_logp_p: torch.Tensor | None,
    cfg: PreferenceConfig,
    num_pairs: float,
) -> tuple[torch.Tensor, Metrics]:
    """SimPO (Meng et al. 2024, eq. 6): -log sigma(beta/|y_c| log pi(y_c) -
    beta/|y_r| log pi(y_r) - gamma); the inputs are already the per-token means
    (1/|y|) log pi(y). No reference policy."""
    r_c, r_r = cfg.beta * chosen_logp_p, cfg.beta * rejected_logp_p
    loss_p = -F.logsigmoid(r_c - r_r - cfg.simpo_gamma)
    return _share(loss_p, num_pairs), _pair_metrics(
        chosen_logp_p, rejected_logp_p, r_c, r_r, num_pairs
    )


@register_preference_loss("orpo", needs_reference=False, length_normalised=True)
def orpo_loss(
    chosen_logp_p: torch.Tensor,
    rejected_logp_p: torch.Tensor,
    ref_chosen_logp_p: torch.Tensor | None,
    ref_rejected_logp_p: torch.Tensor | None,
    cfg: PreferenceConfig,
    num_pairs: float,
) -> tuple[torch.Tensor, Metrics]:
    """ORPO (Hong et al. 2024, eqs. 4-7): L_SFT + lambda L_OR, with lambda = beta,
    L_SFT = -(1/|y_c|) log pi(y_c) and L_OR = -log sigma(log odds(y_c) - log odds(y_r)),
    odds(y) = P / (1 - P) for P = exp((1/|y|) log pi(y)) (the inputs). No reference.

    The NLL is each chosen completion's per-token mean, averaged over pairs (TRL
    averages over the batch's chosen tokens instead)."""
    # log(1 - P) with P < 1 (a completion with P = 1 has infinite odds)
    log1m_c = torch.log1p(-torch.exp(chosen_logp_p).clamp(max=1 - 1e-6))
    log1m_r = torch.log1p(-torch.exp(rejected_logp_p).clamp(max=1 - 1e-6))
    log_odds_p = (chosen_logp_p - log1m_c) - (rejected_logp_p - log1m_r)
    ratio_p = F.logsigmoid(log_odds_p)
    nll_p = -chosen_logp_p
    loss_p = nll_p - cfg.beta * ratio_p
    r_c, r_r = cfg.beta * chosen_logp_p, cfg.beta * rejected_logp_p
    metrics = _pair_metrics(chosen_logp_p, rejected_logp_p, r_c, r_r, num_pairs)
    with torch.no_grad():
        metrics["orpo/nll_loss"] = _share(nll_p.detach(), num_pairs)
        metrics["orpo/log_odds_ratio"] = _share(ratio_p.detach(), num_pairs)
        metrics["orpo/log_odds_chosen"] = _share(log_odds_p.detach(), num_pairs)
    return _share(loss_p, num_pairs), metrics


def bradley_terry_loss(
    chosen_reward_p: torch.Tensor,
    rejected_reward_p: torch.Tensor,
    num_pairs: float,
    margin_p: torch.Tensor | None = None,
    center_coef: float = 0.0,
) -> tuple[torch.Tensor, Metrics]:
    """A reward model's pairwise loss (Bradley and Terry 1952; Ouyang et al. 2022,
    eq. 1): -log sigma(r_c - r_r - m), with the pair's ``margin_p`` m (Touvron et al.
    2023, Llama 2, eq. 2; 0 without one), plus ``center_coef`` * mean((r_c + r_r)^2),
    TRL's ``center_rewards_coefficient`` (Eisenstein et al. 2023), which keeps the
    rewards centred on 0.

    Metrics: ``rm/accuracy`` (share of pairs with r_c > r_r), ``rm/margin`` (mean
    r_c - r_r), ``rm/chosen`` and ``rm/rejected`` (mean rewards).
    """
    diff_p = chosen_reward_p - rejected_reward_p
    if margin_p is not None:
        diff_p = diff_p - margin_p
    loss_p = -F.logsigmoid(diff_p)
    if center_coef:
        loss_p = loss_p + center_coef * (chosen_reward_p + rejected_reward_p) ** 2
    with torch.no_grad():
        c, r = chosen_reward_p.detach(), rejected_reward_p.detach()
        metrics = {
            "rm/accuracy": _share((c > r).float(), num_pairs).detach(),
            "rm/margin": _share(c - r, num_pairs).detach(),
            "rm/chosen": _share(c, num_pairs).detach(),
            "rm/rejected": _share(r, num_pairs).detach(),
        }
    return _share(loss_p, num_pairs), metrics


# Every metric above is a share of a global mean: the trainer sums them.
PAIR_METRICS = frozenset(
    {
        "rewards/chosen",
        "rewards/rejected",
        "rewards/margins",
        "rewards/accuracies",
        "logps/chosen",
        "logps/rejected",
        "orpo/nll_loss",
        "rpo/nll_loss",
        "orpo/log_odds_ratio",
        "orpo/log_odds_chosen",
        "rm/accuracy",
        "rm/margin",
        "rm/chosen",
        "rm/rejected",
    }
)


def with_rpo_nll(
    loss: torch.Tensor,
    metrics: Metrics,
    chosen_mean_logp_p: torch.Tensor,
    cfg: PreferenceConfig,
    num_pairs: float,
) -> torch.Tensor:
    """``loss`` + rpo_alpha * NLL of the chosen completions (each one's per-token mean
    -(1/|y_c|) log pi(y_c), averaged over pairs, as ORPO's; TRL averages over the
    batch's chosen tokens); adds ``rpo/nll_loss`` to ``metrics``."""
    if not cfg.rpo_alpha:
        return loss
    nll_p = -chosen_mean_logp_p
    metrics["rpo/nll_loss"] = _share(nll_p.detach(), num_pairs)
    return loss + cfg.rpo_alpha * _share(nll_p, num_pairs)


def sequence_logps(logp_bt: torch.Tensor, mask_bt: torch.Tensor, mean: bool) -> torch.Tensor:
    """Each sample's response log-prob (b,): the sum over its response tokens, or with
    ``mean`` the per-token mean (SimPO's and ORPO's length normalisation)."""
    mask_bt = mask_bt.to(logp_bt.dtype)
    total_b = (logp_bt * mask_bt).sum(-1)
    return total_b / mask_bt.sum(-1).clamp(min=1.0) if mean else total_b
