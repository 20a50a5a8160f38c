"""The algorithm's settings as ``rlpost.algos`` and the engines take them: small
frozen configs of scalars, built from the run config once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlpost.algos import (
    AdaptiveKLController,
    AdvantageConfig,
    FixedKLController,
    OffPolicyConfig,
    PolicyLossConfig,
)
from rlpost.config.groups import Config
from rlpost.rollout.base import SamplingConfig
from rlpost.trainers.fsdp import RegularizerConfig


@dataclass(frozen=True)
class AlgoSettings:
    advantage: AdvantageConfig
    loss: PolicyLossConfig
    reg: RegularizerConfig
    sampling: SamplingConfig  # one step's sampling; the seed is set per request
    group_multiple: int  # samples per step must split over ranks and mini-batches
    off_policy: OffPolicyConfig = OffPolicyConfig()


def algo_settings(cfg: Config, reward_weights: dict[str, float] | None = None) -> AlgoSettings:
    """``reward_weights``: the weights of the named rewards, as the scorer combines
    them (``reward.weights``, else the reward function's ``default_weights``)."""
    a, r = cfg.algo, cfg.rollout
    weights = cfg.reward.weights if reward_weights is None else reward_weights
    return AlgoSettings(
        advantage=AdvantageConfig(
            estimator=a.advantage.estimator,
            norm_by_std=a.advantage.norm_by_std,
            eps=a.advantage.eps,
            gamma=a.advantage.gamma,
            lam=a.advantage.lam,
            reward_weights=tuple(weights.items()),
        ),
        loss=PolicyLossConfig(
            name=a.policy_loss.name,
            clip_low=a.policy_loss.clip_low,
            clip_high=a.policy_loss.clip_high,
            clip_c=a.policy_loss.clip_c,
            agg=a.policy_loss.agg,
            tau_pos=a.policy_loss.tau_pos,
            tau_neg=a.policy_loss.tau_neg,
            clip_cov_ratio=a.policy_loss.clip_cov_ratio,
            clip_cov_lb=a.policy_loss.clip_cov_lb,
            clip_cov_ub=a.policy_loss.clip_cov_ub,
            kl_cov_ratio=a.policy_loss.kl_cov_ratio,
            ppo_kl_coef=a.policy_loss.ppo_kl_coef,
        ),
        reg=RegularizerConfig(
            kl_coef=a.kl.loss_coef, kl_type=a.kl.loss_type, entropy_coef=a.entropy_coef
        ),
        sampling=SamplingConfig(
            n=r.n,
            temperature=r.temperature,
            top_p=r.top_p,
            max_tokens=r.max_tokens,
            min_tokens=r.min_tokens,
        ),
        group_multiple=cfg.trainer.world_size * a.mini_batches,
        off_policy=off_policy_config(cfg),
    )


def off_policy_config(cfg: Config) -> OffPolicyConfig:
    """``algo.off_policy``, with the old ``algo.rollout_is_cap=C`` read as token_is at C
    (the config check refuses it next to another correction)."""
    op = cfg.algo.off_policy
    cap = op.is_cap if cfg.algo.rollout_is_cap is None else cfg.algo.rollout_is_cap
    return OffPolicyConfig(
        name=op.name, is_cap=cap, lo=op.lo, hi=op.hi, kl_max=op.kl_max, delta=op.delta
    )


def kl_controller(cfg: Config) -> Any:
    """The KL-in-reward coefficient's controller (stateful: one per run)."""
    kl = cfg.algo.kl
    if kl.adaptive:
        return AdaptiveKLController(kl.reward_coef, kl.target, kl.horizon)
    return FixedKLController(kl.reward_coef)
