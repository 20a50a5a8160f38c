"""Off-policy corrections: per-token weights for samples the update's policy did not draw.

Shapes: b = samples, t = response tokens.

Three policies meet in an update: pi_behav sampled the tokens (the rollout engine's
log-probs, ``behav_logp_bt``), pi_prox is the trainer's policy before the update (the
old log-probs, ``prox_logp_bt``; the PPO ratio is pi_theta / pi_prox), and pi_theta is
being trained (``logp_bt``). They differ when the rollout engine computes differently
from the trainer (precision, kernels) or samples with older weights (asynchronous
modes). Each entry of ``OFF_POLICY`` returns ``(w_bt, metrics)``: a detached weight that
scales each token's advantage (scaling A_t by w_t >= 0 scales that token's clipped PPO
term by w_t), 0 for rejected tokens and off the mask. Rejected tokens keep their place
in the loss's denominator (the global token count is fixed before the micro-batches).

Names follow verl 0.9's ``algorithm.rollout_correction`` (Liu, Li et al. 2025, "When
Speed Kills Stability"): ``token_is`` is ``rollout_is=token``, ``seq_is`` is
``rollout_is=sequence`` (both with ``rollout_is_threshold`` = ``is_cap``), ``icepop`` is
``rollout_is=token`` with ``rollout_is_threshold="lo_hi"``, and each rejection criterion
of ``rollout_rs`` (``token_k1`` ... ``seq_max_k3``, see ``REJECTION_CRITERIA``) is an entry of
the same name. ``mis`` is the older ``rollout_rs=geometric``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from rlpost.algos.aggregation import Metrics
from rlpost.algos.config import OffPolicyConfig

# exp(20) ~ 4.9e8: log-ratios are clamped here before exp so a stale token cannot overflow.
LOG_RATIO_BOUND = 20.0

OffPolicyFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, OffPolicyConfig],
    tuple[torch.Tensor, Metrics],
]
OFF_POLICY: dict[str, OffPolicyFn] = {}


def register_off_policy(name: str) -> Callable[[OffPolicyFn], OffPolicyFn]:
    """Decorator adding a correction with ``token_is``'s signature to ``OFF_POLICY``."""

    def deco(fn: OffPolicyFn) -> OffPolicyFn:
        if name in OFF_POLICY:
            raise ValueError(f"off-policy correction {name!r} is already registered")
        OFF_POLICY[name] = fn
        return fn

    return deco


def build_off_policy(cfg: OffPolicyConfig) -> OffPolicyFn:
    """The correction named by ``cfg.name``."""
    if cfg.name not in OFF_POLICY:
        raise KeyError(
            f"unknown off-policy correction algo.off_policy.name={cfg.name!r}; "
            f"choose one of {sorted(OFF_POLICY)}"
        )
    return OFF_POLICY[cfg.name]


def off_policy_metrics(
    w_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    clipped_bt: torch.Tensor,
    rejected_bt: torch.Tensor,
    prox_logp_bt: torch.Tensor,
    behav_logp_bt: torch.Tensor,
) -> Metrics:
    """The ``off_policy/*`` metrics over the mask's tokens.

    is_mean / is_max: of the applied weight; clipped_frac: tokens whose weight was
    truncated; rejected_frac: tokens given weight 0; ess: effective sample size,
    normalised, (sum w)^2 / (n sum w^2) (Kong 1992), 1 when every weight is equal;
    kl_behav: mean of log pi_behav - log pi_prox, the k1 estimate of KL(pi_behav || pi_prox)
    over tokens pi_behav sampled.
    """
    m_bt = mask_bt.to(w_bt.dtype)
    n = m_bt.sum().clamp(min=1)
    w_bt = w_bt * m_bt
    sum_w, sum_w2 = w_bt.sum(), (w_bt * w_bt).sum()
    return {
        "off_policy/is_mean": sum_w / n,
        "off_policy/is_max": w_bt.max() if w_bt.numel() else sum_w.new_zeros(()),
        "off_policy/clipped_frac": (clipped_bt.to(m_bt.dtype) * m_bt).sum() / n,
        "off_policy/rejected_frac": (rejected_bt.to(m_bt.dtype) * m_bt).sum() / n,
        "off_policy/ess": torch.where(sum_w2 > 0, sum_w**2 / (n * sum_w2), 0.0),
        "off_policy/kl_behav": ((behav_logp_bt - prox_logp_bt) * m_bt).sum() / n,
    }


def _seq_sum(x_bt: torch.Tensor, m_bt: torch.Tensor) -> torch.Tensor:
    return (x_bt * m_bt).sum(-1)


def _seq_mean(x_bt: torch.Tensor, m_bt: torch.Tensor) -> torch.Tensor:
    return _seq_sum(x_bt, m_bt) / m_bt.sum(-1).clamp(min=1)


def _bounds(cfg: OffPolicyConfig) -> tuple[float, float]:
    """[lo, hi] of the rejection entries; lo unset is 1 / hi, as verl's default."""
    return (1.0 / cfg.hi if cfg.lo is None else cfg.lo), cfg.hi


def _prepare(
    prox_logp_bt: torch.Tensor, behav_logp_bt: torch.Tensor, mask_bt: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    prox_logp_bt, behav_logp_bt = prox_logp_bt.detach(), behav_logp_bt.detach()
    return prox_logp_bt, behav_logp_bt, mask_bt.to(prox_logp_bt.dtype), prox_logp_bt - behav_logp_bt


@register_off_policy("none")
def no_correction(
    logp_bt: torch.Tensor,
    prox_logp_bt: torch.Tensor,
    behav_logp_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    adv_bt: torch.Tensor,
    cfg: OffPolicyConfig,
) -> tuple[torch.Tensor, Metrics]:
    """Weight 1 on every mask token; the metrics still report the mismatch."""
    prox, behav, m_bt, _ = _prepare(prox_logp_bt, behav_logp_bt, mask_bt)
    zero_bt = torch.zeros_like(m_bt)
    return m_bt, off_policy_metrics(m_bt, m_bt, zero_bt, zero_bt, prox, behav)


@register_off_policy("token_is")
def token_is(
    logp_bt: torch.Tensor,
    prox_logp_bt: torch.Tensor,
    behav_logp_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    adv_bt: torch.Tensor,
    cfg: OffPolicyConfig,
) -> tuple[torch.Tensor, Metrics]:
    """Token truncated IS (TIS; Yao et al. 2025, "Your Efficient RL Framework Secretly
    Brings You Off-Policy RL Training"): w_t = min(rho_t, C), rho_t = pi_prox / pi_behav,
    C = ``is_cap``. verl: ``rollout_is=token``. ``logp_bt`` and ``adv_bt`` are unused.
    """
    prox, behav, m_bt, log_rho_bt = _prepare(prox_logp_bt, behav_logp_bt, mask_bt)
    rho_bt = torch.exp(log_rho_bt.clamp(max=LOG_RATIO_BOUND))
    w_bt = rho_bt.clamp(max=cfg.is_cap) * m_bt
    clipped_bt = rho_bt > cfg.is_cap
    return w_bt, off_policy_metrics(w_bt, m_bt, clipped_bt, torch.zeros_like(m_bt), prox, behav)


@register_off_policy("seq_is")
def seq_is(
    logp_bt: torch.Tensor,
    prox_logp_bt: torch.Tensor,
    behav_logp_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    adv_bt: torch.Tensor,
    cfg: OffPolicyConfig,
) -> tuple[torch.Tensor, Metrics]:
    """Sequence truncated IS: w_i = min(prod_t rho_t, C) on every token of sample i,
    computed as exp(min(sum_t log rho_t, log C)) so a long product cannot overflow
    (Liu, Li et al. 2025, sec. "sequence-level IS"; verl ``rollout_is=sequence``)."""
    prox, behav, m_bt, log_rho_bt = _prepare(prox_logp_bt, behav_logp_bt, mask_bt)
    log_w_b = _seq_sum(log_rho_bt, m_bt)
    log_cap = math.log(cfg.is_cap)
    clipped_b = log_w_b > log_cap
    w_bt = torch.exp(log_w_b.clamp(max=log_cap))[:, None] * m_bt
    clipped_bt = clipped_b[:, None].expand_as(m_bt)
    return w_bt, off_policy_metrics(w_bt, m_bt, clipped_bt, torch.zeros_like(m_bt), prox, behav)


@register_off_policy("decoupled")
def decoupled(
    logp_bt: torch.Tensor,
    prox_logp_bt: torch.Tensor,
    behav_logp_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    adv_bt: torch.Tensor,
    cfg: OffPolicyConfig,
) -> tuple[torch.Tensor, Metrics]:
    """Decoupled PPO's behaviour weight (Fu et al. 2025, AReaL, arXiv 2505.24298, eq. 5):
    the loss is w_t * clipped-PPO(pi_theta / pi_prox) with w_t = pi_prox / pi_behav.

    As AReaL's ``behav_imp_weight_cap``, a token whose w_t exceeds ``is_cap`` is dropped
    (w_t = 0, counted in rejected_frac) rather than truncated to the cap as ``token_is``
    does: such a token was sampled where pi_prox has moved far from pi_behav.
    """
    prox, behav, m_bt, log_rho_bt = _prepare(prox_logp_bt, behav_logp_bt, mask_bt)
    rho_bt = torch.exp(log_rho_bt.clamp(max=LOG_RATIO_BOUND))
    rejected_bt = rho_bt > cfg.is_cap
    w_bt = torch.where(rejected_bt, torch.zeros_like(rho_bt), rho_bt) * m_bt
    return w_bt, off_policy_metrics(w_bt, m_bt, torch.zeros_like(m_bt), rejected_bt, prox, behav)


@register_off_policy("icepop")
def icepop(
    logp_bt: torch.Tensor,
    prox_logp_bt: torch.Tensor,
    behav_logp_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    adv_bt: torch.Tensor,
    cfg: OffPolicyConfig,
) -> tuple[torch.Tensor, Metrics]:
    """IcePop (Ling team 2025, Ring-1T report, sec. "IcePop", M(k) in eq. 2): w_t = rho_t
    where rho_t = pi_prox / pi_behav lies in [lo, hi], 0 outside. Inside the band the token
    keeps its importance weight; tokens on which the two engines disagree most give no
    gradient. verl: ``rollout_is=token``, ``rollout_is_threshold="lo_hi"``. The band with
    weight 1 inside is ``token_k1``."""
    prox, behav, m_bt, log_rho_bt = _prepare(prox_logp_bt, behav_logp_bt, mask_bt)
    lo, hi = _bounds(cfg)
    rho_bt = torch.exp(log_rho_bt.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    rejected_bt = (rho_bt < lo) | (rho_bt > hi)
    w_bt = torch.where(rejected_bt, torch.zeros_like(rho_bt), rho_bt) * m_bt
    return w_bt, off_policy_metrics(w_bt, m_bt, torch.zeros_like(m_bt), rejected_bt, prox, behav)


@register_off_policy("mis")
def mis(
    logp_bt: torch.Tensor,
    prox_logp_bt: torch.Tensor,
    behav_logp_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    adv_bt: torch.Tensor,
    cfg: OffPolicyConfig,
) -> tuple[torch.Tensor, Metrics]:
    """Masked IS by sequence (Liu, Li et al. 2025, "geometric rejection"): sample i is
    rejected when its geometric-mean ratio exp(mean_t log rho_t) lies outside [lo, hi],
    i.e. when its token-mean log-ratio lies outside [log lo, log hi]; kept samples get
    weight 1. Unlike the product, the mean does not grow with the length. verl:
    ``rollout_rs=geometric`` before 0.9; 0.9's ``seq_mean_k1`` bounds the inverse ratio
    (the same samples when lo = 1 / hi)."""
    prox, behav, m_bt, log_rho_bt = _prepare(prox_logp_bt, behav_logp_bt, mask_bt)
    lo, hi = _bounds(cfg)
    mean_b = _seq_mean(log_rho_bt, m_bt)
    rejected_b = (mean_b < math.log(lo)) | (mean_b > math.log(hi))
    rejected_bt = rejected_b[:, None].expand_as(m_bt)
    w_bt = (~rejected_bt).to(m_bt.dtype) * m_bt
    return w_bt, off_policy_metrics(w_bt, m_bt, torch.zeros_like(m_bt), rejected_bt, prox, behav)


@register_off_policy("opsm")
def opsm(
    logp_bt: torch.Tensor,
    prox_logp_bt: torch.Tensor,
    behav_logp_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    adv_bt: torch.Tensor,
    cfg: OffPolicyConfig,
) -> tuple[torch.Tensor, Metrics]:
    """Off-policy sequence masking (DeepSeek-AI 2025, DeepSeek-V3.2, sec. 3.1 "Off-Policy
    Sequence Masking"): M_i = 0 when A_i < 0 and (1/|o_i|) sum_t log(pi_behav / pi_theta)
    > delta, else 1. A negative sample the current policy has drifted away from teaches
    little and destabilises; positive samples are always kept. ``logp_bt`` (pi_theta) is
    read detached; A_i's sign is that of sum_t A_t over the sample's tokens.
    """
    prox, behav, m_bt, _ = _prepare(prox_logp_bt, behav_logp_bt, mask_bt)
    kl_b = _seq_mean(behav - logp_bt.detach(), m_bt)
    neg_b = _seq_sum(adv_bt.detach(), m_bt) < 0
    rejected_bt = (neg_b & (kl_b > cfg.delta))[:, None].expand_as(m_bt)
    w_bt = (~rejected_bt).to(m_bt.dtype) * m_bt
    return w_bt, off_policy_metrics(w_bt, m_bt, torch.zeros_like(m_bt), rejected_bt, prox, behav)


# Rejection criteria, verl 0.9's ``rollout_rs`` options: weight 1 on what is kept, 0 on
# what is rejected. ``token_k*`` judges each token by its own estimate k_t; ``seq_sum_k*``,
# ``seq_mean_k*`` and ``seq_max_k*`` judge a sample by the sum, mean or max of k_t over its
# tokens and keep or reject all of it. k1 = log(pi_behav / pi_prox) is signed and kept
# inside [log lo, log hi] (lo unset: 1 / hi), so token_k1 keeps 1 / hi <= rho_t <= 1 / lo,
# as verl reads "lo_hi" for k1: icepop's band when lo = 1 / hi, its inverse otherwise.
# k2 and k3 are >= 0 and kept up to ``kl_max`` (verl's rollout_rs_threshold for them).
#
# Schulman (2020), "Approximating KL divergence": per-token estimates of
# KL(pi_behav || pi_prox) over tokens pi_behav sampled, from log r_t = log rho_t.
KL_ESTIMATES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "k1": lambda log_r_bt: -log_r_bt,  # log(pi_behav / pi_prox), signed
    "k2": lambda log_r_bt: 0.5 * log_r_bt**2,  # >= 0
    "k3": lambda log_r_bt: torch.expm1(log_r_bt) - log_r_bt,  # r - 1 - log r >= 0
}


def _seq_max(x_bt: torch.Tensor, m_bt: torch.Tensor) -> torch.Tensor:
    """Max over the mask's tokens; 0 for a sample with none."""
    max_b = x_bt.masked_fill(m_bt == 0, -math.inf).max(-1).values
    return torch.where(torch.isinf(max_b), torch.zeros_like(max_b), max_b)


_REDUCE: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "seq_sum": _seq_sum,
    "seq_mean": _seq_mean,
    "seq_max": _seq_max,
}
# verl 0.9's rollout_rs options; k1 is signed, so its max says little and verl has none.
REJECTION_CRITERIA = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)


def _rejection(name: str) -> OffPolicyFn:
    level, k = name.rsplit("_", 1)
    estimate = KL_ESTIMATES[k]

    def reject(
        logp_bt: torch.Tensor,
        prox_logp_bt: torch.Tensor,
        behav_logp_bt: torch.Tensor,
        mask_bt: torch.Tensor,
        adv_bt: torch.Tensor,
        cfg: OffPolicyConfig,
    ) -> tuple[torch.Tensor, Metrics]:
        prox, behav, m_bt, log_r_bt = _prepare(prox_logp_bt, behav_logp_bt, mask_bt)
        k_bt = estimate(log_r_bt.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
        # token: each token's own estimate; seq_*: the sample's, on every one of its tokens
        stat_bt = k_bt if level == "token" else _REDUCE[level](k_bt, m_bt)[:, None]
        if k == "k1":
            lo, hi = _bounds(cfg)
            kept_bt = (stat_bt >= math.log(lo)) & (stat_bt <= math.log(hi))
        else:
            kept_bt = stat_bt <= cfg.kl_max
        rejected_bt = (~kept_bt).expand_as(m_bt)
        w_bt = kept_bt.to(m_bt.dtype).expand_as(m_bt) * m_bt
        zero_bt = torch.zeros_like(m_bt)
        return w_bt, off_policy_metrics(w_bt, m_bt, zero_bt, rejected_bt, prox, behav)

    what = (
        "each token by its own"
        if level == "token"
        else f"each sample by the {level[4:]} of its tokens'"
    )
    bound = "kept inside [log lo, log hi]" if k == "k1" else "kept up to kl_max"
    reject.__name__ = reject.__qualname__ = name
    reject.__doc__ = (
        f"Rejection by {k} (verl ``rollout_rs={name}``): judges {what} {k} estimate of "
        f"KL(pi_behav || pi_prox), {bound}; weight 1 kept, 0 rejected."
    )
    return reject


for _name in REJECTION_CRITERIA:
    register_off_policy(_name)(_rejection(_name))
