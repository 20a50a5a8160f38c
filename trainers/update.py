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

from collections.abc import Callable, Mapping
from typing import Protocol

import torch

from rlpost.algos import PAIR_METRICS, LossNorm
from rlpost.runtime.spans import span
from rlpost.trainers.batch import TrajectoryBatch
from rlpost.trainers.distributed import all_reduce_

# Metrics that are a micro-batch's share of the global loss (or of a global mean
# over preference pairs): summed, not averaged.
SUMMED_METRICS = frozenset({"actor/pg_loss", "actor/kl_loss"}) | PAIR_METRICS
# ``MetricSums``' key for the step's loss (no metric's name: those hold a slash)
LOSS = "loss"

# What the caller does with one micro-batch's model output: its loss (summed and
# back-propagated when training) and rows (b, t) to hand back, or None.
OnOutput = Callable[[TrajectoryBatch, torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]

# One micro-batch's loss from the model's output: its share of the global loss,
# its metrics (0-d tensors or floats) and rows (b, t) to hand back, or None.
MicroLoss = Callable[
    [TrajectoryBatch, torch.Tensor, LossNorm],
    tuple[torch.Tensor, Mapping[str, torch.Tensor | float], torch.Tensor | None],
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


class MetricSums:
    """A step's metric sums over its micro-batches, each kept where its loss computed
    it: the step reads the device once, at its end, not at every metric of every
    micro-batch (each such read waits for the device to finish the forward pass
    before the host may queue the backward). A loss may also give floats."""

    def __init__(self) -> None:
        self.floats: dict[str, float] = {}
        self.tensors: dict[str, torch.Tensor] = {}

    def add(self, key: str, value: torch.Tensor | float, weight: float = 1.0) -> None:
        if isinstance(value, torch.Tensor):
            v = value.detach().to(torch.float64) * weight
            self.tensors[key] = v + self.tensors[key] if key in self.tensors else v
        else:
            self.floats[key] = self.floats.get(key, 0.0) + float(value) * weight

    def keys(self) -> list[str]:
        return sorted(self.floats.keys() | self.tensors.keys())

    def vector(self, keys: list[str]) -> torch.Tensor:
        """The sums of ``keys`` in that order (0 for a key never added), float64, on
        the device of the tensors added, without reading it."""
        out = torch.tensor([self.floats.get(k, 0.0) for k in keys], dtype=torch.float64)
        held = [i for i, k in enumerate(keys) if k in self.tensors]
        if held:
            parts = torch.stack([self.tensors[keys[i]] for i in held])
            out = out.to(parts.device).index_add_(0, torch.tensor(held, device=parts.device), parts)
        return out


def global_metrics(
    sums: MetricSums,
    keys: list[str],
    norm: LossNorm,
    prefix: str,
    contributes: bool = True,
) -> dict[str, float]:
    """A step's metric sums and loss (``sums``' key ``LOSS``) added over every rank (a
    rank that does not contribute sends zeros): ``SUMMED_METRICS`` as totals, the others
    as means per response token of the global batch, and ``{prefix}/loss``. Collective;
    the step's one read of the device."""
    names = [*keys, LOSS]
    local = sums.vector(names) if contributes else torch.zeros(len(names), dtype=torch.float64)
    totals = all_reduce_(local).tolist()
    out = {
        k: totals[i] / (1.0 if k in SUMMED_METRICS else norm.global_tokens)
        for i, k in enumerate(keys)
    }
    out[f"{prefix}/loss"] = totals[-1]
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
    sums = MetricSums()

    def on_output(mb: TrajectoryBatch, output: torch.Tensor):
        loss, metrics, rows = loss_fn(mb, output, norm)
        sums.add(LOSS, loss)
        weight = float(mb.response_mask_bt.sum())  # a CPU tensor: no wait
        for k, v in metrics.items():
            sums.add(k, v, 1.0 if k in SUMMED_METRICS else weight)
        return loss, rows

    rows_bt = backend.forward(batch, on_output, grad=True)
    # The norm is global (every rank sees the same value), so every rank skips
    # together: a NaN or Inf loss or gradient must not reach the weights or Adam.
    with span("optimizer", cat="micro", level="full"):
        grad_norm, lr, skipped = backend.optimizer_step()
    keys = backend.metric_keys([k for k in sums.keys() if k != LOSS])
    out = global_metrics(sums, keys, norm, prefix, backend.reports_metrics)
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
