"""Frozen scalar configs for the pure loss and advantage functions.

Each function in ``algos`` receives one of these small configs, never the run config.
"""

from __future__ import annotations

from dataclasses import dataclass


def _raise_all(owner: str, errors: list[str]) -> None:
    if errors:
        raise ValueError(f"invalid {owner}: " + "; ".join(errors))


@dataclass(frozen=True)
class AdvantageConfig:
    """Settings for ``compute_advantages``; ``estimator`` keys ``ADVANTAGE_ESTIMATORS``."""

    estimator: str = "grpo"
    norm_by_std: bool = True  # False -> Dr.GRPO (A = s - mean_g), Liu et al. 2025
    eps: float = 1e-6
    gamma: float = 1.0  # gae / reinforce_pp discount
    lam: float = 0.95  # gae lambda
    reward_weights: tuple[tuple[str, float], ...] = ()  # gdpo: (reward name, weight) pairs

    def __post_init__(self) -> None:
        errors = []
        if not self.eps > 0:
            errors.append(f"eps={self.eps} must be > 0")
        if not 0.0 <= self.gamma <= 1.0:
            errors.append(f"gamma={self.gamma} must be in [0, 1]")
        if not 0.0 <= self.lam <= 1.0:
            errors.append(f"lam={self.lam} must be in [0, 1]")
        for pair in self.reward_weights:
            if len(pair) != 2 or not isinstance(pair[0], str):
                errors.append(f"reward_weights entry {pair!r} must be a (name, weight) pair")
        _raise_all("AdvantageConfig", errors)


@dataclass(frozen=True)
class PolicyLossConfig:
    """Settings for a policy loss; ``name`` keys ``POLICY_LOSSES``, ``agg`` keys ``AGGREGATIONS``.

    ``clip_high > clip_low`` is DAPO's clip-higher (Yu et al. 2025, eq. 10); ``clip_c`` is the
    dual-clip bound for negative advantages (Ye et al. 2020, eq. 5); ``clip_low = 1`` sets no
    lower bound (CISPO's usual choice). ``cispo`` clips its detached weight with
    clip_low/clip_high, ``gmpo`` reads them as log-ratio bounds. The other fields are those of
    one loss each, named as verl's: ``tau_pos``/``tau_neg`` (sapo), ``clip_cov_*`` (clip_cov),
    ``kl_cov_ratio`` and ``ppo_kl_coef`` (kl_cov).
    """

    name: str = "ppo_clip"
    clip_low: float = 0.2
    clip_high: float = 0.2
    clip_c: float | None = None
    agg: str = "token-mean"
    log_ratio_clamp: float = 20.0
    tau_pos: float = 1.0  # sapo: gate temperature for A > 0 (Gao et al. 2025)
    tau_neg: float = 1.05  # sapo: gate temperature for A <= 0
    clip_cov_ratio: float = 2e-4  # clip_cov: share of tokens whose gradient is dropped
    clip_cov_lb: float = 1.0  # clip_cov: covariance band, lower end
    clip_cov_ub: float = 5.0  # clip_cov: covariance band, upper end
    kl_cov_ratio: float = 2e-4  # kl_cov: share of tokens given the KL term
    ppo_kl_coef: float = 1.0  # kl_cov: coefficient of |log r| on those tokens

    def __post_init__(self) -> None:
        errors = []
        if not 0.0 <= self.clip_low <= 1.0:
            errors.append(f"clip_low={self.clip_low} must be in [0, 1]")
        if not self.clip_high >= 0.0:
            errors.append(f"clip_high={self.clip_high} must be >= 0")
        if self.clip_c is not None and not self.clip_c > 1.0:
            errors.append(f"clip_c={self.clip_c} must be > 1 (or None to disable dual clip)")
        if not self.log_ratio_clamp > 0:
            errors.append(f"log_ratio_clamp={self.log_ratio_clamp} must be > 0")
        for key in ("tau_pos", "tau_neg"):
            if not getattr(self, key) > 0:
                errors.append(f"{key}={getattr(self, key)} must be > 0")
        for key in ("clip_cov_ratio", "kl_cov_ratio"):
            if not 0.0 < getattr(self, key) <= 1.0:
                errors.append(f"{key}={getattr(self, key)} must be in (0, 1]")
        if not self.clip_cov_lb < self.clip_cov_ub:
            errors.append(
                f"clip_cov_lb={self.clip_cov_lb} must be < clip_cov_ub={self.clip_cov_ub}"
            )
        if not self.ppo_kl_coef >= 0:
            errors.append(f"ppo_kl_coef={self.ppo_kl_coef} must be >= 0")
        _raise_all("PolicyLossConfig", errors)


@dataclass(frozen=True)
class LossNorm:
    """Counts over the WHOLE global batch (all micro-batches, all ranks), so the summed
    gradient is independent of how the batch is split."""

    global_tokens: float  # number of response tokens (mask==1) in the global batch
    global_samples: float  # number of samples in the global batch
    norm_const: float = 1.0  # seq-mean-token-sum-norm divisor (e.g. max response length)

    def __post_init__(self) -> None:
        errors = []
        if not self.global_tokens >= 0:
            errors.append(f"global_tokens={self.global_tokens} must be >= 0")
        if not self.global_samples >= 0:
            errors.append(f"global_samples={self.global_samples} must be >= 0")
        if not self.norm_const > 0:
            errors.append(f"norm_const={self.norm_const} must be > 0")
        _raise_all("LossNorm", errors)


@dataclass(frozen=True)
class OffPolicyConfig:
    """Settings for an off-policy correction; ``name`` keys ``OFF_POLICY``.

    ``is_cap``: C of token_is / seq_is (truncation) and decoupled (tokens above it are
    dropped); ``lo``/``hi``: the ratio interval icepop and mis keep (``lo`` None: 1 / hi),
    and the k1 band of the ``*_k1`` rejections; ``kl_max``: the largest k2 / k3 estimate the
    ``*_k2`` / ``*_k3`` rejections keep; ``delta``: opsm's KL(pi_behav || pi_theta) bound on
    a negative sample. The default is the token truncated IS the trainer has always applied.
    """

    name: str = "token_is"
    is_cap: float = 2.0
    lo: float | None = None
    hi: float = 2.0
    kl_max: float = 0.01
    delta: float = 1e-3

    def __post_init__(self) -> None:
        errors = []
        if not self.is_cap > 0:
            errors.append(f"is_cap={self.is_cap} must be > 0")
        if not self.hi > 0:
            errors.append(f"hi={self.hi} must be > 0")
        if self.lo is not None and not 0 < self.lo < self.hi:
            errors.append(f"lo={self.lo} must be in (0, hi={self.hi})")
        if self.lo is None and self.hi > 0 and not self.hi > 1:
            errors.append(f"hi={self.hi} must be > 1 when lo is unset (lo = 1 / hi)")
        if not self.kl_max > 0:
            errors.append(f"kl_max={self.kl_max} must be > 0")
        if not self.delta >= 0:
            errors.append(f"delta={self.delta} must be >= 0")
        _raise_all("OffPolicyConfig", errors)
