"""What the FSDP2 policy and critic engines share: process group, sharding,
and the micro-batched, globally normalised optimizer step.

Legend: b = samples, t = tokens.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from algos import LossNorm
from trainers.batch import TrajectoryBatch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Metrics that are a micro-batch's share of the global loss: summed, not averaged.
SUMMED_METRICS = frozenset({"actor/pg_loss", "actor/kl_loss"})

LossFn = Callable[[TrajectoryBatch, LossNorm], tuple[torch.Tensor, dict[str, float]]]


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)
    max_grad_norm: float = 1.0
    lr_warmup_steps: int = 0


def init_distributed(device: str, backend: str, rank: int, world_size: int, init_method: str):
    """Join the process group (once per process) and return this rank's device."""
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)
    return torch.device(device)


def shard(model: torch.nn.Module, layers: torch.nn.ModuleList) -> None:
    """FSDP2: one shard group per transformer layer, then the rest of the model."""
    from torch.distributed.fsdp import fully_shard

    for layer in layers:
        fully_shard(layer)
    fully_shard(model)


def micro_batches(batch: TrajectoryBatch, size: int) -> list[TrajectoryBatch]:
    return [batch.select(slice(i, i + size)).trim() for i in range(0, len(batch), size)]


def global_norm(batch: TrajectoryBatch, norm_const: float) -> LossNorm:
    """Response-token and sample counts over every rank's share of the batch."""
    counts = torch.tensor(
        [float(batch.response_mask_bt.sum()), float(len(batch))], dtype=torch.float64
    )
    dist.all_reduce(counts)
    return LossNorm(
        global_tokens=max(counts[0].item(), 1.0),
        global_samples=max(counts[1].item(), 1.0),
        norm_const=norm_const,
    )


class Updater:
    """AdamW with linear LR warm-up and gradient clipping, one step per call."""

    def __init__(self, model: torch.nn.Module, cfg: OptimConfig, world_size: int, micro_size: int):
        self.model, self.cfg = model, cfg
        self.world_size, self.micro_size = world_size, micro_size
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=cfg.lr,
            betas=cfg.betas,
            weight_decay=cfg.weight_decay,
        )
        warmup = max(cfg.lr_warmup_steps, 0)
        # A fresh Adam moves every weight by ~lr on its first steps whatever the
        # gradient's size; a linear warm-up keeps that from wrecking a tuned model.
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / (warmup + 1))
        )

    def step(self, batch: TrajectoryBatch, loss_fn: LossFn, norm_const: float, prefix: str):
        """One optimizer step over this rank's ``batch``, accumulating micro-batches.

        Metrics are global: loss shares are summed, per-token means are weighted by
        token counts, both over every micro-batch and every rank.
        """
        self.model.train()
        norm = global_norm(batch, norm_const)
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        loss_sum = 0.0
        for mb in micro_batches(batch, self.micro_size):
            loss, metrics = loss_fn(mb, norm)
            # FSDP averages gradients over ranks; the loss is already a global
            # mean, so undo the average.
            (loss * self.world_size).backward()
            loss_sum += float(loss.detach())
            weight = float(mb.response_mask_bt.sum())
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + float(v) * (1.0 if k in SUMMED_METRICS else weight)
        norm_t = torch.nn.utils.clip_grad_norm_(
            [p for p in self.model.parameters() if p.requires_grad], self.cfg.max_grad_norm
        )
        grad_norm = float(norm_t.full_tensor() if hasattr(norm_t, "full_tensor") else norm_t)
        self.optimizer.step()
        lr = float(self.scheduler.get_last_lr()[0])
        self.scheduler.step()
        keys = sorted(sums)
        totals = torch.tensor([sums[k] for k in keys] + [loss_sum], dtype=torch.float64)
        dist.all_reduce(totals)
        out = {
            k: totals[i].item() / (1.0 if k in SUMMED_METRICS else norm.global_tokens)
            for i, k in enumerate(keys)
        }
        out[f"{prefix}/loss"] = totals[-1].item()
        out[f"{prefix}/grad_norm"] = grad_norm
        out[f"{prefix}/lr"] = lr
        return out


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
    return {k: sum(h[k] for h in history) / len(history) for k in history[0]}
