"""The algorithm group's parts (``algo.*``) that ``rlpost.algos`` does not declare
itself: the KL penalty, DAPO's sample filters, and the DPO and reward-model presets'
own settings. The advantage, the policy loss, the off-policy correction and on-policy
distillation are the algos' configs (``rlpost.algos.config``, ``rlpost.algos.distill``);
``AlgoConfig``, which holds them all, is in ``rlpost.config.groups``."""

from __future__ import annotations

from dataclasses import dataclass

from rlpost.algos.config import KL_KINDS, PreferenceConfig
from rlpost.config.schema import spec


@dataclass(frozen=True)
class KLSchema:
    loss_coef: float = spec(0.0, ge=0, help="KL-to-reference loss coefficient (0 = off)")
    loss_type: str = spec("k3", choices=KL_KINDS, help="estimator in the loss")
    reward_coef: float = spec(0.0, ge=0, help="KL penalty in the reward (0 = off)")
    reward_type: str = spec("k1", choices=KL_KINDS, help="estimator in the reward")
    adaptive: bool = spec(False, help="adapt reward_coef towards target (Ziegler et al. 2019)")
    target: float = spec(0.1, gt=0, help="adaptive controller's target KL")
    horizon: float = spec(10000.0, gt=0, help="adaptive controller's horizon (samples)")


@dataclass(frozen=True)
class DynamicSamplingSchema:
    enabled: bool = spec(False, help="DAPO: drop groups whose rewards all agree, refill")
    max_rounds: int = spec(
        3, ge=1, help="generation rounds per step before training on what is kept"
    )


@dataclass(frozen=True)
class OverlongSchema:
    enabled: bool = spec(False, help="DAPO: penalise completions near rollout.max_tokens")
    buffer: int = spec(4, ge=1, help="penalty ramps linearly over the last `buffer` tokens")
    factor: float = spec(1.0, ge=0, help="scale of the penalty (-factor beyond the limit)")


@dataclass(frozen=True)
class DPOSchema(PreferenceConfig):
    """``algo=dpo``: the preference loss's settings (``rlpost.algos.PreferenceConfig``,
    docs/preference.md) and when the loop computes the reference log-probs."""

    precompute_ref: bool = spec(
        False,
        help="the reference log-probs of every pair once at the start, instead of per batch (saves a forward pass a step)",
    )


@dataclass(frozen=True)
class RMSchema:
    """``algo=rm``: a Bradley-Terry reward model on the policy's backbone."""

    center_rewards_coef: float = spec(
        0.0,
        ge=0,
        help="weight of mean((r_c + r_r)^2), keeping rewards near 0 (TRL's center_rewards_coefficient)",
    )
