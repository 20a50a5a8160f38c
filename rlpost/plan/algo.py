"""The algorithm's settings as ``rlpost.algos`` and the engines take them: small
frozen configs of scalars, built from the run config once."""

from __future__ import annotations

from dataclasses import dataclass, replace

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
    them (``reward.weights``, else the reward function's ``default_weights``). The
    advantage, policy-loss and off-policy groups are the configs ``rlpost.algos`` takes,
    passed through (the advantage's with the reward weights filled in)."""
    a, r = cfg.algo, cfg.rollout
    weights = cfg.reward.weights if reward_weights is None else reward_weights
    return AlgoSettings(
        advantage=replace(a.advantage, reward_weights=tuple(weights.items())),
        loss=a.policy_loss,
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
        off_policy=a.off_policy,
    )


def kl_controller(cfg: Config) -> AdaptiveKLController | FixedKLController:
    """The KL-in-reward coefficient's controller (stateful: one per run)."""
    kl = cfg.algo.kl
    if kl.adaptive:
        return AdaptiveKLController(kl.reward_coef, kl.target, kl.horizon)
    return FixedKLController(kl.reward_coef)
