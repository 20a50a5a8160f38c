"""Frozen scalar configs for the pure loss and advantage functions, which are also the
run config's groups ``algo.advantage``, ``algo.policy_loss`` and ``algo.off_policy``.

Each function in ``algos`` receives one of these small configs, never the run config.
Every field is declared once, with its help text and checks (``rlpost.algos.spec``):
building one in Python checks it as the run config's validator does.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlpost.algos.aggregation import AGGREGATIONS
from rlpost.algos.spec import check, spec

# the KL estimators kl_penalty knows (algos/kl.py), named here so the run config's
# schema can list them without importing torch
KL_KINDS = ("k1", "k2", "k3", "abs")


@dataclass(frozen=True)
class AdvantageConfig:
    """Settings for ``compute_advantages``; ``estimator`` keys ``ADVANTAGE_ESTIMATORS``."""

    estimator: str = spec(
        "grpo",
        help="grpo, rloo, reinforce_pp, reinforce_pp_baseline, gae, gdpo, or a registered name",
    )
    # False -> Dr.GRPO (A = s - mean_g), Liu et al. 2025
    norm_by_std: bool = spec(True, help="grpo: divide by the group std (false: Dr.GRPO)")
    eps: float = spec(1e-6, gt=0, help="added to standard deviations")
    gamma: float = spec(1.0, ge=0, le=1, help="discount (gae, reinforce_pp)")
    lam: float = spec(0.95, ge=0, le=1, help="GAE lambda")
    reward_weights: tuple[tuple[str, float], ...] = spec(
        (), setting=False, help="gdpo: (reward name, weight) pairs, the reward group's weights"
    )

    def __post_init__(self) -> None:
        check(self, self.rules)

    def rules(self, at: str = "") -> list[str]:
        return [
            f"{at}reward_weights entry {pair!r} must be a (name, weight) pair"
            for pair in self.reward_weights
            if len(pair) != 2 or not isinstance(pair[0], str)
        ]


@dataclass(frozen=True)
class PolicyLossConfig:
    """Settings for a policy loss; ``name`` keys ``POLICY_LOSSES``, ``agg`` keys ``AGGREGATIONS``.

    ``clip_high > clip_low`` is DAPO's clip-higher (Yu et al. 2025, eq. 10); ``clip_c`` is the
    dual-clip bound for negative advantages (Ye et al. 2020, eq. 5); ``clip_low = 1`` sets no
    lower bound (CISPO's usual choice). ``cispo`` clips its detached weight with
    clip_low/clip_high, ``gmpo`` reads them as log-ratio bounds. The other fields are those of
    one loss each, named as verl's: ``tau_pos``/``tau_neg`` (sapo, Gao et al. 2025),
    ``clip_cov_*`` (clip_cov), ``kl_cov_ratio`` and ``ppo_kl_coef`` (kl_cov).
    """

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
    clip_c: float | None = spec(
        None, gt=1, help="dual-clip bound for negative advantages (null = off)"
    )
    agg: str = spec(
        "token-mean", choices=tuple(AGGREGATIONS), help="loss aggregation over the global batch"
    )
    log_ratio_clamp: float = spec(
        20.0,
        gt=0,
        setting=False,
        help="log pi - log pi_old is clamped to +-this before exp, so a stale token cannot overflow",
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

    def __post_init__(self) -> None:
        check(self, self.rules)

    def rules(self, at: str = "") -> list[str]:
        if self.clip_cov_lb < self.clip_cov_ub:
            return []
        return [f"{at}clip_cov_lb={self.clip_cov_lb}: must be < {at}clip_cov_ub={self.clip_cov_ub}"]


@dataclass(frozen=True)
class OffPolicyConfig:
    """Settings for an off-policy correction; ``name`` keys ``OFF_POLICY``.

    ``is_cap``: C of token_is / seq_is (truncation) and decoupled (tokens above it are
    dropped); ``lo``/``hi``: the ratio interval icepop and mis keep (``lo`` None: 1 / hi),
    and the k1 band of the ``*_k1`` rejections; ``kl_max``: the largest k2 / k3 estimate the
    ``*_k2`` / ``*_k3`` rejections keep; ``delta``: opsm's KL(pi_behav || pi_theta) bound on
    a negative sample. The default is the token truncated IS the trainer has always applied.
    """

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

    def __post_init__(self) -> None:
        check(self, self.rules)

    def rules(self, at: str = "") -> list[str]:
        if self.lo is not None and self.lo >= self.hi:
            return [f"{at}lo={self.lo}: must be < {at}hi={self.hi}"]
        if self.lo is None and self.hi <= 1:
            return [f"{at}hi={self.hi}: must be > 1 when {at}lo is unset (lo = 1 / hi)"]
        return []


@dataclass(frozen=True)
class DistillConfig:
    """``algo=opd``: on-policy distillation from ``teacher.path`` (docs/distillation.md);
    the run config's ``algo.opd``."""

    kl_coef: float = spec(
        1.0,
        gt=0,
        help="lambda: A_t = -lambda (log pi(y_t) - log pi_teacher(y_t)) on each sampled token",
    )
    task_advantage: bool = spec(
        False,
        help="add the task reward's advantage (algo.advantage.estimator on reward.*): A_t = A_task - lambda (log pi - log pi_teacher), as slime's OPD",
    )

    def __post_init__(self) -> None:
        check(self)


@dataclass(frozen=True)
class PreferenceConfig:
    """Settings of a preference loss; ``loss`` keys ``PREFERENCE_LOSSES``.

    ``beta``: DPO's KL strength (sigmoid, ipo, hinge), SimPO's reward scale, ORPO's
    weight of the odds-ratio term (its lambda). ``label_smoothing``: the assumed
    share of flipped labels (conservative DPO, sigmoid only). ``simpo_gamma``:
    SimPO's target reward margin. ``rpo_alpha``: the weight of an NLL term on the
    chosen completions added to the loss (RPO: Pang et al. 2024, "Iterative
    Reasoning Preference Optimization", eq. 3; TRL's ``rpo_alpha``): it keeps the
    chosen log-probs from falling with the rejected ones. ORPO has that term with
    weight 1 already; ``rpo_alpha`` adds to it.
    """

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
        lt=0.5,
        help="share of flipped labels assumed, below 0.5 (conservative DPO; sigmoid only)",
    )
    simpo_gamma: float = spec(0.5, help="simpo: target reward margin gamma")
    rpo_alpha: float = spec(
        0.0,
        ge=0,
        help="weight of an NLL term on the chosen completions (RPO, TRL's rpo_alpha): keeps their log-probs from falling; with orpo it adds to orpo's own (weight 1)",
    )

    def __post_init__(self) -> None:
        check(self, self.rules)

    def rules(self, at: str = "") -> list[str]:
        if not self.label_smoothing or self.loss == "sigmoid":
            return []
        return [
            f"{at}label_smoothing={self.label_smoothing}: conservative DPO smooths the sigmoid "
            f"loss only, not {at}loss={self.loss}"
        ]
