"""Loss aggregation: reduce a per-token loss to the scalar that is back-propagated.

Shapes: b = samples, t = tokens.

Every mode divides by counts of the *global* batch (``LossNorm``), so the sum of
``aggregate`` over micro-batches equals ``aggregate`` over the whole batch, whatever the
split (the token-count bias discussed in DAPO, Yu et al. 2025, sec. 3.3, and Dr.GRPO,
Liu et al. 2025, sec. 3.1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlpost.algos.spec import check, spec

if TYPE_CHECKING:  # the run config's schema imports LossNorm and AGGREGATIONS' names: no torch
    import torch


@dataclass(frozen=True)
class LossNorm:
    """Counts over the WHOLE global batch (all micro-batches, all ranks), so the summed
    gradient is independent of how the batch is split."""

    global_tokens: float = spec(
        ge=0, help="number of response tokens (mask==1) in the global batch"
    )
    global_samples: float = spec(ge=0, help="number of samples in the global batch")
    norm_const: float = spec(
        1.0, gt=0, help="seq-mean-token-sum-norm divisor (e.g. max response length)"
    )

    def __post_init__(self) -> None:
        check(self)


# A loss's metrics: 0-d tensors where the loss was computed, read by the update
# once per optimizer step (reading each one as a float would wait for the device
# at every micro-batch, before its backward pass is even queued).
Metrics = dict[str, "torch.Tensor"]

AggFn = Callable[["torch.Tensor", "torch.Tensor", LossNorm], "torch.Tensor"]


def _den(x: float) -> float:
    # an all-empty global batch gives a zero loss rather than 0/0
    return max(float(x), 1.0)


def _token_mean(loss_bt: torch.Tensor, mask_bt: torch.Tensor, norm: LossNorm) -> torch.Tensor:
    return (loss_bt * mask_bt).sum() / _den(norm.global_tokens)


def _seq_mean_token_sum(
    loss_bt: torch.Tensor, mask_bt: torch.Tensor, norm: LossNorm
) -> torch.Tensor:
    return (loss_bt * mask_bt).sum() / _den(norm.global_samples)


def _seq_mean_token_mean(
    loss_bt: torch.Tensor, mask_bt: torch.Tensor, norm: LossNorm
) -> torch.Tensor:
    n_b = mask_bt.sum(-1).clamp(min=1)
    return ((loss_bt * mask_bt).sum(-1) / n_b).sum() / _den(norm.global_samples)


def _seq_mean_token_sum_norm(
    loss_bt: torch.Tensor, mask_bt: torch.Tensor, norm: LossNorm
) -> torch.Tensor:
    # Dr.GRPO (Liu et al. 2025, eq. 3): a constant divisor instead of |o_i|
    return (loss_bt * mask_bt).sum() / (_den(norm.global_samples) * norm.norm_const)


AGGREGATIONS: dict[str, AggFn] = {
    "token-mean": _token_mean,
    "seq-mean-token-sum": _seq_mean_token_sum,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}


def aggregate(
    loss_bt: torch.Tensor, mask_bt: torch.Tensor, mode: str, norm: LossNorm
) -> torch.Tensor:
    """Reduce ``loss_bt`` [b, t] over tokens where ``mask_bt`` [b, t] is 1 to a scalar.

    Modes (n_i = response tokens of sample i, at least 1):
      token-mean:              sum(loss*mask) / global_tokens
      seq-mean-token-sum:      sum_i sum_t loss*mask / global_samples
      seq-mean-token-mean:     sum_i (sum_t loss*mask / n_i) / global_samples
      seq-mean-token-sum-norm: sum(loss*mask) / (global_samples * norm_const)
    """
    if mode not in AGGREGATIONS:
        raise KeyError(f"unknown loss aggregation {mode!r}; choose one of {sorted(AGGREGATIONS)}")
    if loss_bt.shape != mask_bt.shape:
        raise ValueError(
            f"loss_bt {tuple(loss_bt.shape)} and mask_bt {tuple(mask_bt.shape)} differ"
        )
    return AGGREGATIONS[mode](loss_bt, mask_bt.to(loss_bt.dtype), norm)


def masked_mean(x_bt: torch.Tensor, mask_bt: torch.Tensor) -> torch.Tensor:
    """Mean of ``x_bt`` over mask tokens of this tensor only (for metrics); 0 if none."""
    mask_bt = mask_bt.to(x_bt.dtype)
    return (x_bt * mask_bt).sum() / mask_bt.sum().clamp(min=1)
