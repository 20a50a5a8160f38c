"""Per-group statistics broadcast back to samples (a group = the n samples of one prompt).

Shapes: b = samples, g = groups.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def group_index(group_ids_b: torch.Tensor | Sequence) -> tuple[torch.Tensor, int]:
    """Map arbitrary group ids (int tensor, or a list of hashables such as uuids) to
    dense indices 0..g-1. Returns ``(idx_b, g)``."""
    if isinstance(group_ids_b, torch.Tensor):
        _, idx_b = torch.unique(group_ids_b, return_inverse=True)
        return idx_b.reshape(-1), int(idx_b.max()) + 1 if idx_b.numel() else 0
    dense: dict = {}
    idx = [dense.setdefault(gid, len(dense)) for gid in group_ids_b]
    return torch.tensor(idx, dtype=torch.long), len(dense)


def group_mean_std(
    x_b: torch.Tensor, group_ids_b: torch.Tensor | Sequence
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample group mean, unbiased group std (as ``torch.std``) and group size.

    A group of one has std 0 (not NaN). A group whose values are all equal has a
    mean exactly equal to them and std exactly 0: summing n copies of 0.7 and
    dividing by n need not give 0.7 back in float32, and that rounding noise,
    divided by ``std + eps``, would otherwise become a non-zero advantage.
    Returns ``(mean_b, std_b, count_b)``.
    """
    idx_b, g = group_index(group_ids_b)
    if idx_b.numel() != x_b.numel():
        raise ValueError(f"{x_b.numel()} scores but {idx_b.numel()} group ids")
    idx_b = idx_b.to(x_b.device)
    count_g = torch.zeros(g, dtype=x_b.dtype, device=x_b.device).index_add_(
        0, idx_b, torch.ones_like(x_b)
    )
    sum_g = torch.zeros(g, dtype=x_b.dtype, device=x_b.device).index_add_(0, idx_b, x_b)
    uniform_g, first_g = _uniform_groups(x_b, idx_b, g)
    mean_b = torch.where(uniform_g, first_g, sum_g / count_g)[idx_b]
    sq_g = torch.zeros(g, dtype=x_b.dtype, device=x_b.device).index_add_(
        0, idx_b, (x_b - mean_b) ** 2
    )
    var_g = sq_g / (count_g - 1).clamp(min=1)
    return mean_b, var_g.sqrt()[idx_b], count_g[idx_b]


def _uniform_groups(
    x_b: torch.Tensor, idx_b: torch.Tensor, g: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which groups hold one value only (bool_g), and that value (x_g; the min)."""
    big = torch.full((g,), float("inf"), dtype=x_b.dtype, device=x_b.device)
    min_g = big.scatter_reduce(0, idx_b, x_b, reduce="amin")
    max_g = (-big).scatter_reduce(0, idx_b, x_b, reduce="amax")
    return min_g == max_g, min_g


def uniform_groups(x_b: torch.Tensor, group_ids_b: torch.Tensor | Sequence) -> torch.Tensor:
    """Per sample: True where every sample of its group has the same value (bool_b)."""
    idx_b, g = group_index(group_ids_b)
    idx_b = idx_b.to(x_b.device)
    uniform_g, _ = _uniform_groups(x_b, idx_b, g)
    return uniform_g[idx_b]
