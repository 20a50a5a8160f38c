"""Pure tensor math for RL post-training: advantages, policy and value losses, KL,
entropy, loss aggregation, sample filters, off-policy corrections and on-policy
distillation's advantage. Imports torch only.

The package is lazy: importing it (or its torch-free ``config``, which the run
config's schema reads, so ``rlpost --help`` starts without torch) loads nothing
else. The first name taken from the package itself loads every submodule, which
registers each ``loss_*`` module's losses in ``POLICY_LOSSES``.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlpost.algos.advantages import (
        ADVANTAGE_ESTIMATORS,
        compute_advantages,
        gae_advantage,
        gdpo_advantage,
        grpo_advantage,
        last_token_rewards,
        masked_whiten,
        register_advantage,
        reinforce_pp_advantage,
        reinforce_pp_baseline_advantage,
        rloo_advantage,
    )
    from rlpost.algos.aggregation import (
        AGGREGATIONS,
        LossNorm,
        Metrics,
        aggregate,
        masked_mean,
    )
    from rlpost.algos.config import (
        KL_KINDS,
        AdvantageConfig,
        DistillConfig,
        OffPolicyConfig,
        PolicyLossConfig,
        PreferenceConfig,
    )
    from rlpost.algos.distill import opd_advantage
    from rlpost.algos.entropy import entropy_from_logits
    from rlpost.algos.filters import overlong_penalty, truncated_is_weight, zero_std_groups
    from rlpost.algos.kl import (
        AdaptiveKLController,
        FixedKLController,
        kl_penalty,
        kl_reward_penalty,
    )
    from rlpost.algos.loss_cispo import cispo_loss
    from rlpost.algos.loss_cov import clip_cov_loss, kl_cov_loss, token_covariance
    from rlpost.algos.loss_gmpo import gmpo_loss
    from rlpost.algos.loss_sapo import sapo_loss
    from rlpost.algos.off_policy import OFF_POLICY, build_off_policy, register_off_policy
    from rlpost.algos.policy_loss import (
        POLICY_LOSSES,
        build_policy_loss,
        gspo_loss,
        ppo_clip_loss,
        register_policy_loss,
        sft_loss,
    )
    from rlpost.algos.preference import (
        PAIR_METRICS,
        PREFERENCE_LOSSES,
        PreferenceLoss,
        bradley_terry_loss,
        build_preference_loss,
        register_preference_loss,
        sequence_logps,
        with_rpo_nll,
    )
    from rlpost.algos.value_loss import clipped_value_loss, explained_variance

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATIONS",
    "KL_KINDS",
    "OFF_POLICY",
    "PAIR_METRICS",
    "POLICY_LOSSES",
    "PREFERENCE_LOSSES",
    "AdaptiveKLController",
    "AdvantageConfig",
    "DistillConfig",
    "FixedKLController",
    "LossNorm",
    "Metrics",
    "OffPolicyConfig",
    "PolicyLossConfig",
    "PreferenceConfig",
    "PreferenceLoss",
    "aggregate",
    "bradley_terry_loss",
    "build_off_policy",
    "build_policy_loss",
    "cispo_loss",
    "clip_cov_loss",
    "build_preference_loss",
    "clipped_value_loss",
    "compute_advantages",
    "entropy_from_logits",
    "explained_variance",
    "gae_advantage",
    "gdpo_advantage",
    "gmpo_loss",
    "grpo_advantage",
    "gspo_loss",
    "kl_cov_loss",
    "kl_penalty",
    "kl_reward_penalty",
    "last_token_rewards",
    "masked_mean",
    "masked_whiten",
    "opd_advantage",
    "overlong_penalty",
    "ppo_clip_loss",
    "register_advantage",
    "register_off_policy",
    "register_policy_loss",
    "register_preference_loss",
    "reinforce_pp_advantage",
    "reinforce_pp_baseline_advantage",
    "rloo_advantage",
    "sapo_loss",
    "sequence_logps",
    "with_rpo_nll",
    "sft_loss",
    "token_covariance",
    "truncated_is_weight",
    "zero_std_groups",
]


def _load() -> None:
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for name in __all__:
            if name in vars(module):
                globals()[name] = vars(module)[name]


def __getattr__(name: str) -> object:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _load()
    return globals()[name]
