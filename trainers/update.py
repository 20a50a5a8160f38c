"""The update loop every training backend shares: one globally normalised optimizer
step over micro-batches, and epochs of mini-batch steps.

Legend: b = samples, t = tokens.

A backend (FSDP2, Megatron) runs the forward and backward passes and owns the
optimizer; what a step is lives here once. Loss normalisers are global counts
(all-reduced), so the gradient does not depend on how the batch was split over
ranks and micro-batches, and every metric is global: loss shares are summed,
per-token means are weighted by token counts, both over every micro-batch and
every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from rlpost.algos import PAIR_METRICS, LossNorm
from rlpost.runtime.spans import span
from rlpost.trainers.batch import TrajectoryBatch
from rlpost.trainers.distributed import all_reduce_

# Metrics that are a micro-batch's share of the global loss (or of a global mean
# over preference pairs): summed, not averaged.
SUMMED_METRICS = frozenset({"actor/pg_loss", "actor/kl_loss"}) | PAIR_METRICS

# What the caller does with one micro-batch's model output: its loss (summed and
# back-propagated when training) and rows (b, t) to hand back, or None.
OnOutput = Callable[[TrajectoryBatch, torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]

# One micro-batch's loss from the model's output: its share of the global loss,
# its metrics and rows (b, t) to hand back, or None.
MicroLoss = Callable[
    [TrajectoryBatch, torch.Tensor, LossNorm],
    tuple[torch.Tensor, dict[str, float], torch.Tensor | None],
]


class Backend(Protocol):
    """What a training backend supplies to the shared update loop: forward passes,
    the optimizer step and how its ranks report metrics."""

    @property
    def trainable(self) -> bool:
        """False for a frozen reference policy (no optimizer)."""
        ...

    @property
    def reports_metrics(self) -> bool:
        """Whether this rank's metric sums count (one rank per data-parallel batch does)."""
        ...

    def forward(self, batch: TrajectoryBatch, on_output: OnOutput, *, grad: bool) -> torch.Tensor:
        """Every micro-batch of this rank's ``batch`` through the model, calling
        ``on_output(mb, output)`` on each; with ``grad`` in training mode, its losses
        back-propagated (gradients summed over micro-batches and ranks). Returns the
        rows ``on_output`` handed back as one float32 (b, t) tensor of this rank's
        rows, zeros where it handed back none. Collective."""
        ...

    def zero_grad(self) -> None: ...

    def optimizer_step(self) -> tuple[float, float, bool]:
        """Clip and step unless the global gradient norm is NaN or Inf; returns
        ``(grad_norm, lr, skipped)``. Collective."""
        ...

    def metric_keys(self, keys: list[str]) -> list[str]:
        """Every rank's metric names in one order, given this rank's (sorted)."""
        ...


def global_norm(batch: TrajectoryBatch, norm_const: float) -> LossNorm:
    """Response-token and sample counts over every rank's share of the batch."""
    counts = torch.tensor(
        [float(batch.response_mask_bt.sum()), float(batch.real_samples)], dtype=torch.float64
    )
    all_reduce_(counts)  # on the group's device: NCCL takes no CPU tensor
    return LossNorm(
        global_tokens=max(counts[0].item(), 1.0),
        global_samples=max(counts[1].item(), 1.0),
        norm_const=norm_const,
    )


def global_metrics(
    sums: dict[str, float],
    keys: list[str],
    loss_sum: float,
    norm: LossNorm,
    prefix: str,
    contributes: bool = True,
) -> dict[str, float]:
    """A step's metric sums and loss added over every rank (a rank that does not
    contribute sends zeros): ``SUMMED_METRICS`` as totals, the others as means per
    response token of the global batch, and ``{prefix}/loss``. Collective."""
    local = [sums[k] for k in keys] + [loss_sum] if contributes else [0.0] * (len(keys) + 1)
    totals = torch.tensor(local, dtype=torch.float64)
    all_reduce_(totals)
    out = {
        k: totals[i].item() / (1.0 if k in SUMMED_METRICS else norm.global_tokens)
        for i, k in enumerate(keys)
    }
    out[f"{prefix}/loss"] = totals[-1].item()
    return out


def step(
    backend: Backend, batch: TrajectoryBatch, loss_fn: MicroLoss, norm_const: float, prefix: str
) -> tuple[dict[str, float], torch.Tensor]:
    """One optimizer step over this rank's ``batch``, accumulating micro-batches.

    Returns global metrics (``{prefix}/loss``, ``/grad_norm``, ``/lr``,
    ``/skipped_updates`` and ``loss_fn``'s) and the rows (b, t) ``loss_fn`` handed
    back, zeros where it handed back none. Collective.
    """
    if not backend.trainable:
        raise RuntimeError("this engine is a frozen reference policy; it cannot update")
    norm = global_norm(batch, norm_const)
    backend.zero_grad()
    sums: dict[str, float] = {}
    loss_sum = 0.0

    def on_output(mb: TrajectoryBatch, output: torch.Tensor):
        nonlocal loss_sum
        loss, metrics, rows = loss_fn(mb, output, norm)
        loss_sum += float(loss.detach())
        weight = float(mb.response_mask_bt.sum())
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0.0) + float(v) * (1.0 if k in SUMMED_METRICS else weight)
        return loss, rows

    rows_bt = backend.forward(batch, on_output, grad=True)
    # The norm is global (every rank sees the same value), so every rank skips
    # together: a NaN or Inf loss or gradient must not reach the weights or Adam.
    with span("optimizer", cat="micro", level="full"):
        grad_norm, lr, skipped = backend.optimizer_step()
    keys = backend.metric_keys(sorted(sums))
    out = global_metrics(sums, keys, loss_sum, norm, prefix, backend.reports_metrics)
    out[f"{prefix}/grad_norm"] = grad_norm
    out[f"{prefix}/lr"] = lr
    out[f"{prefix}/skipped_updates"] = float(skipped)
    return out, rows_bt


def run_epochs(
    step: Callable[[TrajectoryBatch], dict[str, float]],
    batch: TrajectoryBatch,
    epochs: int,
    mini_batches: int,
) -> dict[str, float]:
    """``epochs`` passes over ``batch``, each split into ``mini_batches`` optimizer steps."""
    history: list[dict[str, float]] = []
    size = len(batch) // mini_batches
    for _ in range(epochs):
        for i in range(mini_batches):
            history.append(step(batch.select(slice(i * size, (i + 1) * size))))
    # Counts add up over the optimizer steps; everything else is their mean.
    return {
        k: sum(h[k] for h in history) / (1 if k.endswith("skipped_updates") else len(history))
        for k in history[0]
    }
