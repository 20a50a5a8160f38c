"""DAPO sample handling (Yu et al. 2025): overlong reward shaping and dynamic sampling.

Shapes: b = samples.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlpost.algos.aggregation import Metrics
from rlpost.algos.groups import uniform_groups


def overlong_penalty(
    response_lengths_b: torch.Tensor, *, max_len: int, buffer: int
) -> torch.Tensor:
    """Soft overlong punishment (DAPO eq. 13), added to the reward:

    0 if L <= max_len - buffer ; ((max_len - buffer) - L) / buffer inside the buffer ;
    -1 if L > max_len. Returns a float ``penalty_b``.
    """
    if not 0 < buffer <= max_len:
        raise ValueError(f"overlong buffer={buffer} must be in (0, max_len={max_len}]")
    lengths_b = response_lengths_b.to(torch.float32)
    start = float(max_len - buffer)
    penalty_b = ((start - lengths_b) / buffer).clamp(max=0.0)
    return torch.where(lengths_b > max_len, torch.full_like(lengths_b, -1.0), penalty_b)


def zero_std_groups(scores_b: torch.Tensor, group_ids_b: torch.Tensor | Sequence) -> torch.Tensor:
    """Dynamic sampling (DAPO eq. 11): ``keep_b`` is False for samples whose group has all
    scores equal (std 0, including a group of one), since their advantage is zero and they
    add no gradient. Compared exactly (max == min), not by a float tolerance."""
    return ~uniform_groups(scores_b, group_ids_b)


def truncated_is_weight(
    old_logp_bt: torch.Tensor, rollout_logp_bt: torch.Tensor, mask_bt: torch.Tensor, cap: float
) -> tuple[torch.Tensor, Metrics]:
    """Truncated importance weight w_t = min(pi_old / pi_rollout, C) per token (TIS;
    Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
    Training"), correcting for samples drawn by a stale or numerically different
    rollout policy. Zero off the mask. Returns the weights and their metrics.
    """
    mask_bt = mask_bt.to(old_logp_bt.dtype)
    log_w_bt = (old_logp_bt - rollout_logp_bt).clamp(max=20.0)
    raw_bt = torch.exp(log_w_bt)
    w_bt = raw_bt.clamp(max=cap) * mask_bt
    n = mask_bt.sum().clamp(min=1)
    metrics = {
        "rollout/is_weight_mean": w_bt.sum() / n,
        "rollout/is_capped_frac": ((raw_bt > cap).to(mask_bt.dtype) * mask_bt).sum() / n,
    }
    return w_bt, metrics
