"""The algorithm group's parts (``algo.*``): advantages, the policy loss, the KL
penalty, DAPO's sample filters, the off-policy correction, and each preset's own
settings (DPO, the reward model, on-policy distillation). ``AlgoConfig``, which
holds them, is in ``rlpost.config.groups``."""

from __future__ import annotations

from dataclasses import dataclass

from rlpost.config.schema import spec

AGGREGATIONS = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
KL_TYPES = ("k1", "k2", "k3", "abs")


@dataclass(frozen=True)
class AdvantageSchema:
    estimator: str = spec(
        "grpo",
        help="grpo, rloo, reinforce_pp, reinforce_pp_baseline, gae, gdpo, or a registered name",
    )
    norm_by_std: bool = spec(True, help="grpo: divide by the group std (false: Dr.GRPO)")
    eps: float = spec(1e-6, gt=0, help="added to standard deviations")
    gamma: float = spec(1.0, ge=0, le=1, help="discount (gae, reinforce_pp)")
    lam: float = spec(0.95, ge=0, le=1, help="GAE lambda")


@dataclass(frozen=True)
class PolicyLossSchema:
    name: str = spec(
        "ppo_clip",
        help="ppo_clip, gspo, cispo, sapo, geo_mean (= gmpo), clip_cov, kl_cov, or a registered name",
    )
    clip_low: float = spec(
        0.2,
        ge=0,
        le=1,
        help="lower clip: ratio >= 1 - clip_low (1: no lower bound; geo_mean: log-ratio >= -clip_low)",
    )
    clip_high: float = spec(
        0.2,
        ge=0,
        help="upper clip: ratio <= 1 + clip_high (DAPO: > clip_low; geo_mean: log-ratio <= clip_high)",
    )
    clip_c: float | None = spec(None, help="dual-clip bound for negative advantages (null = off)")
    agg: str = spec(
        "token-mean", choices=AGGREGATIONS, help="loss aggregation over the global batch"
    )
    tau_pos: float = spec(1.0, gt=0, help="sapo: gate temperature for positive advantages")
    tau_neg: float = spec(1.05, gt=0, help="sapo: gate temperature for negative advantages")
    clip_cov_ratio: float = spec(
        2e-4, gt=0, le=1, help="clip_cov: share of a micro-batch's tokens whose gradient is dropped"
    )
    clip_cov_lb: float = spec(1.0, help="clip_cov: lower end of the covariance band")
    clip_cov_ub: float = spec(5.0, help="clip_cov: upper end of the covariance band")
    kl_cov_ratio: float = spec(
        2e-4, gt=0, le=1, help="kl_cov: share of a micro-batch's tokens given the KL term"
    )
    ppo_kl_coef: float = spec(
        1.0, ge=0, help="kl_cov: coefficient of abs(log ratio) on those tokens"
    )


@dataclass(frozen=True)
class KLSchema:
    loss_coef: float = spec(0.0, ge=0, help="KL-to-reference loss coefficient (0 = off)")
    loss_type: str = spec("k3", choices=KL_TYPES, help="estimator in the loss")
    reward_coef: float = spec(0.0, ge=0, help="KL penalty in the reward (0 = off)")
    reward_type: str = spec("k1", choices=KL_TYPES, help="estimator in the reward")
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
class OffPolicySchema:
    name: str = spec(
        "token_is",
        help="correction for tokens the rollout sampled off the trainer's policy: none, token_is, "
        "seq_is, decoupled, icepop, mis, opsm, verl's rejections token_k1..3, seq_sum_k1..3, "
        "seq_mean_k1..3, seq_max_k2..3, or a registered name (docs/algorithms.md)",
    )
    is_cap: float = spec(
        2.0,
        gt=0,
        help="C: token_is min(rho_t, C), seq_is min(prod rho_t, C), decoupled drops tokens with rho_t > C "
        "(verl rollout_is_threshold)",
    )
    lo: float | None = spec(
        None,
        gt=0,
        help="icepop, mis: lower ratio kept; *_k1: lower bound of pi_rollout / pi_old, as verl's "
        "'lo_hi' thresholds (null: 1 / hi)",
    )
    hi: float = spec(
        2.0, gt=0, help="icepop, mis: upper ratio kept; *_k1: upper bound of pi_rollout / pi_old"
    )
    kl_max: float = spec(
        0.01,
        gt=0,
        help="*_k2, *_k3: largest KL estimate kept (verl rollout_rs_threshold for those options)",
    )
    delta: float = spec(
        1e-3,
        ge=0,
        help="opsm: a negative-advantage sample whose mean log(pi_rollout / pi) exceeds this is masked",
    )


@dataclass(frozen=True)
class DPOSchema:
    """``algo=dpo``: the preference loss and its settings (docs/preference.md)."""

    loss: str = spec(
        "sigmoid",
        help="sigmoid (DPO), ipo, hinge (SLiC), simpo (reference-free, length-normalised), orpo (odds ratio + NLL, reference-free), or a registered name",
    )
    beta: float = spec(
        0.1, gt=0, help="KL strength (sigmoid, ipo, hinge); reward scale (simpo); lambda (orpo)"
    )
    label_smoothing: float = spec(
        0.0,
        ge=0,
        le=0.5,
        help="share of flipped labels assumed, below 0.5 (conservative DPO; sigmoid only)",
    )
    simpo_gamma: float = spec(0.5, help="simpo: target reward margin gamma")
    rpo_alpha: float = spec(
        0.0,
        ge=0,
        help="weight of an NLL term on the chosen completions (RPO, TRL's rpo_alpha): keeps their log-probs from falling; with orpo it adds to orpo's own (weight 1)",
    )
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


@dataclass(frozen=True)
class OPDSchema:
    """``algo=opd``: on-policy distillation from ``teacher.path`` (docs/distillation.md)."""

    kl_coef: float = spec(
        1.0,
        gt=0,
        help="lambda: A_t = -lambda (log pi(y_t) - log pi_teacher(y_t)) on each sampled token",
    )
    task_advantage: bool = spec(
        False,
        help="add the task reward's advantage (algo.advantage.estimator on reward.*): A_t = A_task - lambda (log pi - log pi_teacher), as slime's OPD",
    )
