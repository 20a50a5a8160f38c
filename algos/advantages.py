"""Advantage estimators: scores (per sample) or token rewards -> advantages.

Shapes: b = samples, t = response tokens.

Per-sample estimators return ``adv_b``; token-level ones return ``adv_bt`` (zero where
``mask_bt`` is 0). ``compute_advantages`` dispatches by name through
``ADVANTAGE_ESTIMATORS`` and always returns ``(adv_bt, returns_bt | None)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from rlpost.algos.config import AdvantageConfig
from rlpost.algos.groups import group_mean_std, uniform_groups

GroupIds = torch.Tensor | Sequence


def masked_whiten(x_bt: torch.Tensor, mask_bt: torch.Tensor, eps: float) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over mask tokens, with the unbiased variance (as verl's
    ``masked_whiten``); zero outside the mask. Fewer than two tokens -> all zero."""
    mask_bt = mask_bt.to(x_bt.dtype)
    n = mask_bt.sum()
    mean = (x_bt * mask_bt).sum() / n.clamp(min=1)
    var = (((x_bt - mean) * mask_bt) ** 2).sum() / (n - 1).clamp(min=1)
    return (x_bt - mean) * torch.rsqrt(var + eps) * mask_bt


def grpo_advantage(
    scores_b: torch.Tensor, group_ids_b: GroupIds, *, norm_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO outcome advantage (Shao et al. 2024, DeepSeekMath sec. 4.1.2):
    A_i = (s_i - mean_g) / (std_g + eps), std unbiased as ``torch.std`` and verl.

    ``norm_by_std=False`` is Dr.GRPO (Liu et al. 2025, eq. 3): A_i = s_i - mean_g.
    A group of one carries no relative signal and gets A = 0. Returns ``adv_b``.
    """
    mean_b, std_b, _ = group_mean_std(scores_b, group_ids_b)
    adv_b = scores_b - mean_b
    if norm_by_std:
        adv_b = adv_b / (std_b + eps)
    return adv_b


def rloo_advantage(scores_b: torch.Tensor, group_ids_b: GroupIds) -> torch.Tensor:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024, eq. 5):
    A_i = s_i - mean of the other samples in the group; a group of one gets 0."""
    mean_b, std_b, count_b = group_mean_std(scores_b, group_ids_b)
    others_mean_b = (mean_b * count_b - scores_b) / (count_b - 1).clamp(min=1)
    # Equal scores: exactly 0, not the float noise of (n*s - s)/(n-1) - s.
    signal_b = (count_b > 1) & (std_b > 0)
    return torch.where(signal_b, scores_b - others_mean_b, torch.zeros_like(scores_b))


def reinforce_pp_advantage(
    token_rewards_bt: torch.Tensor, mask_bt: torch.Tensor, *, gamma: float = 1.0, eps: float = 1e-6
) -> torch.Tensor:
    """REINFORCE++ (Hu 2025, eq. 7-8): G_t = r_t + gamma * G_{t'} with t' the next
    response token, then whitened over all response tokens of the batch.

    Tokens with mask 0 are skipped: their reward is ignored and the return passes
    through them unchanged, so tool output inside a multi-turn response does not break
    the sum. Returns ``adv_bt``.
    """
    mask_bt = mask_bt.to(token_rewards_bt.dtype)
    returns_bt = torch.zeros_like(token_rewards_bt)
    running_b = torch.zeros_like(token_rewards_bt[:, 0])
    for t in reversed(range(token_rewards_bt.shape[1])):
        m_b = mask_bt[:, t]
        running_b = m_b * (token_rewards_bt[:, t] + gamma * running_b) + (1 - m_b) * running_b
        returns_bt[:, t] = running_b
    return masked_whiten(returns_bt, mask_bt, eps)


def reinforce_pp_baseline_advantage(
    scores_b: torch.Tensor, group_ids_b: GroupIds, mask_bt: torch.Tensor, *, eps: float = 1e-6
) -> torch.Tensor:
    """REINFORCE++-baseline (Hu 2025, sec. 3.3): (s_i - mean_g) broadcast to the response
    tokens, then whitened over all response tokens of the batch. Returns ``adv_bt``.

    A group whose scores all agree is centred to exactly 0 (not the float noise of
    s - mean_g), and then whitened with the batch like every other sample, as the paper
    defines the estimator: its tokens get (0 - mean) / std, the batch's own shift.
    """
    mean_b, _, _ = group_mean_std(scores_b, group_ids_b)
    mask_bt = mask_bt.to(scores_b.dtype)
    centred_b = scores_b - mean_b
    centred_b = torch.where(uniform_groups(scores_b, group_ids_b), 0.0, centred_b)
    return masked_whiten(centred_b[:, None] * mask_bt, mask_bt, eps)


def gae_advantage(
    token_rewards_bt: torch.Tensor,
    values_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    *,
    gamma: float,
    lam: float,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, eq. 11-16).

    delta_t = r_t + gamma V_{t'} - V_t ;  A_t = delta_t + gamma lam A_{t'} ;  R_t = A_t + V_t
    where t' is the next response token (V = A = 0 past the last one). Mask-0 tokens
    between response tokens (tool output in multi-turn) are jumped over, as verl's
    multi-turn GAE does. Advantages are whitened over mask tokens; returns are not.
    Returns ``(adv_bt, returns_bt)``, both zero outside the mask.
    """
    mask_bt = mask_bt.to(values_bt.dtype)
    adv_bt = torch.zeros_like(values_bt)
    next_value_b = torch.zeros_like(values_bt[:, 0])
    next_adv_b = torch.zeros_like(values_bt[:, 0])
    for t in reversed(range(values_bt.shape[1])):
        m_b = mask_bt[:, t]
        delta_b = token_rewards_bt[:, t] + gamma * next_value_b - values_bt[:, t]
        adv_t_b = delta_b + gamma * lam * next_adv_b
        next_value_b = m_b * values_bt[:, t] + (1 - m_b) * next_value_b
        next_adv_b = m_b * adv_t_b + (1 - m_b) * next_adv_b
        adv_bt[:, t] = adv_t_b * m_b
    returns_bt = (adv_bt + values_bt) * mask_bt
    return masked_whiten(adv_bt, mask_bt, eps), returns_bt


def gdpo_advantage(
    named_scores: dict[str, torch.Tensor],
    group_ids_b: GroupIds,
    weights: dict[str, float],
    *,
    eps: float = 1e-6,
) -> torch.Tensor:
    """GDPO, group reward-decoupled normalisation for multi-reward RL:
    each reward k is normalised within its group, A_k = (r_k - mean_gk) / (std_gk + eps),
    combined as sum_k w_k A_k, then normalised over the whole batch (mean 0, std 1,
    unbiased std). Normalising each reward separately keeps one reward's scale from
    swamping the others. A group in which every reward agrees gets advantage 0
    (the batch normalisation would otherwise shift it). Returns ``adv_b``.
    """
    missing = sorted(set(weights) - set(named_scores))
    if missing:
        raise KeyError(
            f"gdpo weights name rewards {missing} absent from scores {sorted(named_scores)}"
        )
    if not weights:
        raise ValueError("gdpo needs at least one (reward name, weight) pair")
    combined_b = sum(
        w * grpo_advantage(named_scores[k], group_ids_b, eps=eps) for k, w in weights.items()
    )
    assert isinstance(combined_b, torch.Tensor)
    if combined_b.numel() < 2:
        return torch.zeros_like(combined_b)
    no_signal_b = torch.stack([uniform_groups(named_scores[k], group_ids_b) for k in weights]).all(
        0
    )
    adv_b = (combined_b - combined_b.mean()) / (combined_b.std() + eps)
    return torch.where(no_signal_b, torch.zeros_like(adv_b), adv_b)


# --- registry and dispatcher --------------------------------------------------------------

# An estimator entry: (cfg, scores_b, group_ids_b, mask_bt, token_rewards_bt, values_bt)
# -> (adv_bt, returns_bt | None), all keyword arguments after cfg.
EstimatorFn = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
ADVANTAGE_ESTIMATORS: dict[str, EstimatorFn] = {}
# Estimators whose advantage is one number per sample, from statistics over samples
# (a group's, the batch's): an episode counts once in them, whatever its segments.
PER_SAMPLE_ESTIMATORS: set[str] = set()


def register_advantage(
    name: str, *, per_sample: bool = False
) -> Callable[[EstimatorFn], EstimatorFn]:
    """Decorator adding an estimator to ``ADVANTAGE_ESTIMATORS`` under ``name``.

    The function is called as ``fn(cfg, *, scores_b, group_ids_b, mask_bt,
    token_rewards_bt, values_bt)`` and returns ``(adv_bt, returns_bt | None)``.
    ``per_sample``: the advantage is the same on every token of a sample (see
    ``compute_advantages`` for what that changes for split episodes).
    """

    def deco(fn: EstimatorFn) -> EstimatorFn:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ADVANTAGE_ESTIMATORS[name] = fn
        if per_sample:
            PER_SAMPLE_ESTIMATORS.add(name)
        return fn

    return deco


def _total(scores_b: dict[str, torch.Tensor]) -> torch.Tensor:
    if "total" not in scores_b:
        raise KeyError(
            f"this advantage estimator needs scores_b['total'] (the combined reward); "
            f"got only {sorted(scores_b)}"
        )
    return scores_b["total"]


def last_token_rewards(scores_b: torch.Tensor, mask_bt: torch.Tensor) -> torch.Tensor:
    """Place each sample's score on its last response token; [b] -> [b, t]."""
    t_idx_bt = torch.arange(mask_bt.shape[1], device=mask_bt.device).expand_as(mask_bt)
    last_b = torch.where(mask_bt.bool(), t_idx_bt, -1).max(dim=1).values
    rewards_bt = torch.zeros(mask_bt.shape, dtype=scores_b.dtype, device=scores_b.device)
    has_b = last_b >= 0
    rows_b = torch.arange(mask_bt.shape[0], device=mask_bt.device)[has_b]
    rewards_bt[rows_b, last_b[has_b]] = scores_b[has_b]
    return rewards_bt


def _per_sample(adv_b: torch.Tensor, mask_bt: torch.Tensor) -> tuple[torch.Tensor, None]:
    return adv_b[:, None] * mask_bt.to(adv_b.dtype), None


@register_advantage("grpo", per_sample=True)
def _grpo(cfg: AdvantageConfig, *, scores_b, group_ids_b, mask_bt, **_):
    adv_b = grpo_advantage(_total(scores_b), group_ids_b, norm_by_std=cfg.norm_by_std, eps=cfg.eps)
    return _per_sample(adv_b, mask_bt)


@register_advantage("rloo", per_sample=True)
def _rloo(cfg: AdvantageConfig, *, scores_b, group_ids_b, mask_bt, **_):
    return _per_sample(rloo_advantage(_total(scores_b), group_ids_b), mask_bt)


@register_advantage("reinforce_pp")
def _reinforce_pp(cfg: AdvantageConfig, *, scores_b, mask_bt, token_rewards_bt, **_):
    if token_rewards_bt is None:
        token_rewards_bt = last_token_rewards(_total(scores_b), mask_bt)
    return reinforce_pp_advantage(token_rewards_bt, mask_bt, gamma=cfg.gamma, eps=cfg.eps), None


@register_advantage("reinforce_pp_baseline", per_sample=True)
def _reinforce_pp_baseline(cfg: AdvantageConfig, *, scores_b, group_ids_b, mask_bt, **_):
    adv_bt = reinforce_pp_baseline_advantage(_total(scores_b), group_ids_b, mask_bt, eps=cfg.eps)
    return adv_bt, None


@register_advantage("gae")
def _gae(cfg: AdvantageConfig, *, scores_b, mask_bt, token_rewards_bt, values_bt, **_):
    if values_bt is None:
        raise ValueError("estimator 'gae' needs values_bt from the critic; got None")
    if token_rewards_bt is None:
        token_rewards_bt = last_token_rewards(_total(scores_b), mask_bt)
    return gae_advantage(
        token_rewards_bt, values_bt, mask_bt, gamma=cfg.gamma, lam=cfg.lam, eps=cfg.eps
    )


@register_advantage("gdpo", per_sample=True)
def _gdpo(cfg: AdvantageConfig, *, scores_b, group_ids_b, mask_bt, **_):
    # A named reward the weights leave out counts with weight 1.0, as in the total.
    weights = {k: 1.0 for k in scores_b if k != "total"} | dict(cfg.reward_weights)
    if not weights:
        raise ValueError(
            "estimator 'gdpo' normalises each named reward on its own, and the scores hold "
            "only a total: return a dict of named rewards"
        )
    return _per_sample(gdpo_advantage(scores_b, group_ids_b, weights, eps=cfg.eps), mask_bt)


def compute_advantages(
    cfg: AdvantageConfig,
    *,
    scores_b: dict[str, torch.Tensor],
    group_ids_b: GroupIds,
    mask_bt: torch.Tensor,
    token_rewards_bt: torch.Tensor | None = None,
    values_bt: torch.Tensor | None = None,
    owner_b: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run the estimator ``cfg.estimator``; returns ``(adv_bt, returns_bt | None)``.

    Single-reward estimators read ``scores_b['total']``; per-sample advantages are
    broadcast over ``mask_bt`` (zero on non-response tokens). For gae / reinforce_pp
    without ``token_rewards_bt``, the total score is placed on the last response token.

    ``owner_b`` (``TrajectoryBatch.owner_b``): rows that are further segments of
    another row's episode, and padding rows (-1). A per-sample estimator then runs
    on the episodes' own rows only, so each episode counts once in a group's mean
    and std, and every segment gets its episode's advantage; a token-level one
    (gae, reinforce_pp) runs on every row, each segment a trajectory that ends in
    its episode's reward (given in ``scores_b`` per row).
    """
    if cfg.estimator not in ADVANTAGE_ESTIMATORS:
        raise KeyError(
            f"unknown advantage estimator {cfg.estimator!r}; "
            f"choose one of {sorted(ADVANTAGE_ESTIMATORS)}"
        )
    fn = ADVANTAGE_ESTIMATORS[cfg.estimator]
    if owner_b is None or cfg.estimator not in PER_SAMPLE_ESTIMATORS:
        if owner_b is not None:  # padding rows carry no advantage
            mask_bt = mask_bt * (owner_b >= 0)[:, None].to(mask_bt.dtype)
        return fn(
            cfg, scores_b=scores_b, group_ids_b=group_ids_b, mask_bt=mask_bt,
            token_rewards_bt=token_rewards_bt, values_bt=values_bt,
        )  # fmt: skip
    rows_e = torch.nonzero(owner_b == torch.arange(len(owner_b))).flatten()
    adv_et, _ = fn(
        cfg,
        scores_b={k: v[rows_e] for k, v in scores_b.items()},
        group_ids_b=torch.as_tensor(group_ids_b)[rows_e],
        mask_bt=mask_bt[rows_e],
        token_rewards_bt=None,
        values_bt=None,
    )
    # The one advantage of each episode: its value on any response token (an
    # episode's own row always has one: a call samples at least its end token).
    mask_et = mask_bt[rows_e].to(adv_et.dtype)
    adv_e = (adv_et * mask_et).sum(-1) / mask_et.sum(-1).clamp(min=1)
    index_b = torch.zeros(len(owner_b), dtype=torch.long)
    index_b[rows_e] = torch.arange(len(rows_e))
    adv_b = torch.where(owner_b >= 0, adv_e[index_b[owner_b.clamp(min=0)]], 0.0)
    return _per_sample(adv_b, mask_bt)
