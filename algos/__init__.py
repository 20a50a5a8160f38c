"""Pure tensor math for RL post-training: advantages, policy and value losses, KL,
entropy, loss aggregation, sample filters and off-policy corrections. Imports torch only."""

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
from rlpost.algos.aggregation import AGGREGATIONS, aggregate, masked_mean
from rlpost.algos.config import AdvantageConfig, LossNorm, OffPolicyConfig, PolicyLossConfig
from rlpost.algos.entropy import entropy_from_logits
from rlpost.algos.filters import overlong_penalty, truncated_is_weight, zero_std_groups
from rlpost.algos.kl import (
    KL_KINDS,
    AdaptiveKLController,
    FixedKLController,
    kl_penalty,
    kl_reward_penalty,
)
from rlpost.algos.off_policy import OFF_POLICY, build_off_policy, register_off_policy
from rlpost.algos.policy_loss import (
    POLICY_LOSSES,
    build_policy_loss,
    gspo_loss,
    ppo_clip_loss,
    register_policy_loss,
    sft_loss,
)
from rlpost.algos.value_loss import clipped_value_loss, explained_variance

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATIONS",
    "KL_KINDS",
    "OFF_POLICY",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "AdvantageConfig",
    "FixedKLController",
    "LossNorm",
    "OffPolicyConfig",
    "PolicyLossConfig",
    "aggregate",
    "build_off_policy",
    "build_policy_loss",
    "clipped_value_loss",
    "compute_advantages",
    "entropy_from_logits",
    "explained_variance",
    "gae_advantage",
    "gdpo_advantage",
    "grpo_advantage",
    "gspo_loss",
    "kl_penalty",
    "kl_reward_penalty",
    "last_token_rewards",
    "masked_mean",
    "masked_whiten",
    "overlong_penalty",
    "ppo_clip_loss",
    "register_advantage",
    "register_off_policy",
    "register_policy_loss",
    "reinforce_pp_advantage",
    "reinforce_pp_baseline_advantage",
    "rloo_advantage",
    "sft_loss",
    "truncated_is_weight",
    "zero_std_groups",
]
