"""What the FSDP2 policy and critic engines share: process group, sharding,
and the micro-batched, globally normalised optimizer step.

Legend: b = samples, t = tokens.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from rlpost.algos import LossNorm
from rlpost.trainers.batch import TrajectoryBatch

log = logging.getLogger(__name__)

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


def shard(
    model: torch.nn.Module,
    layers: torch.nn.ModuleList,
    *,
    offload: bool = False,
    mixed_precision: str = "none",
) -> None:
    """FSDP2: one shard group per transformer layer, then the rest of the model
    (with one rank and neither offload nor bf16, the model stays as it is).

    ``offload`` keeps the sharded parameters, their gradients and so the
    optimizer step and state on the CPU (``CPUOffloadPolicy``); each layer's
    parameters are copied to the device for its forward and backward.
    ``mixed_precision="bf16"`` computes in bf16 and reduces gradients in fp32
    while the sharded master weights and the optimizer stay fp32.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    if dist.get_world_size() == 1 and not offload and mixed_precision == "none":
        # One rank has nothing to shard: FSDP2's per-layer hooks and copies would
        # cost ~25 % of a small model's update (0.056 s of 0.233 s at 32 x 8,
        # built-in model) and buy nothing. Offload and bf16 are FSDP2 policies.
        return
    kwargs: dict = {}
    if offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    if mixed_precision == "bf16":
        on_cpu = next(model.parameters()).device.type == "cpu"
        if on_cpu and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            log.warning(
                "mixed_precision=bf16 on a CPU without bf16 instructions (avx512_bf16, AMX): "
                "slower than float32 here; set trainer.mixed_precision=none"
            )
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    elif mixed_precision != "none":
        raise ValueError(f"mixed_precision={mixed_precision!r}: expected 'none' or 'bf16'")
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)


def row_lengths(batch: TrajectoryBatch) -> list[int]:
    """Tokens per row (right padding: the attention mask is a prefix of ones)."""
    return [int(n) for n in batch.attention_mask_bt.sum(dim=1).tolist()]


def micro_batches(
    batch: TrajectoryBatch, size: int, tokens: int = 0, packed: bool = False
) -> list[TrajectoryBatch]:
    """Consecutive groups of rows, in order, each trimmed of all-padding columns.

    ``tokens == 0``: groups of ``size`` rows. ``tokens > 0``: greedy groups whose
    cost stays within ``tokens``, where the cost is what the forward pass
    processes: the sum of row lengths when ``packed``, rows x longest row
    otherwise. A row longer than the budget gets a group of its own.
    """
    if tokens <= 0:
        return [batch.select(slice(i, i + size)).trim() for i in range(0, len(batch), size)]
    groups: list[TrajectoryBatch] = []
    start, longest, total = 0, 0, 0
    for i, n in enumerate(row_lengths(batch)):
        rows = i - start + 1
        cost = total + n if packed else rows * max(longest, n)
        if i > start and cost > tokens:
            groups.append(batch.select(slice(start, i)).trim())
            start, longest, total = i, 0, 0
        longest, total = max(longest, n), total + n
    groups.append(batch.select(slice(start, len(batch))).trim())
    return groups


def pack(mb: TrajectoryBatch) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Concatenate the rows' tokens into one (1, sum of lengths) row without padding.

    Returns ``(ids_1T, position_ids_1T, lengths)``; positions restart at 0 for
    each sample. With no attention mask, transformers reads the restarts as
    sample boundaries and masks attention block-diagonally (causal within a
    sample, nothing across samples); the packing tests check that log-probs
    and gradients equal the padded path's.
    """
    lengths = row_lengths(mb)
    ids = torch.cat([mb.input_ids_bt[i, :n] for i, n in enumerate(lengths)])
    pos = torch.cat([torch.arange(n) for n in lengths])
    return ids[None], pos[None], lengths


def unpack(values_1T: torch.Tensor, lengths: list[int], width: int) -> torch.Tensor:
    """Inverse of ``pack`` for per-token values: (1, T) -> (b, width), 0 in padding.

    Position 0 of each row is set to 0: in the packed row it holds a
    prediction from the previous sample's last token.
    """
    rows = []
    for chunk in torch.split(values_1T[0], lengths):
        row = F.pad(chunk[1:], (1, width - len(chunk)))
        rows.append(row)
    return torch.stack(rows)


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

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: OptimConfig,
        world_size: int,
        split: Callable[[TrajectoryBatch], list[TrajectoryBatch]],
    ):
        self.model, self.cfg = model, cfg
        self.world_size, self.split = world_size, split
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
        for mb in self.split(batch):
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
        lr = float(self.scheduler.get_last_lr()[0])
        # The norm is global (every rank sees the same value), so every rank skips
        # together: a NaN or Inf loss or gradient must not reach the weights or Adam.
        skipped = not math.isfinite(grad_norm)
        if skipped:
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.optimizer.step()
            self.scheduler.step()
        out = global_metrics(sums, sorted(sums), loss_sum, norm, prefix)
        out[f"{prefix}/grad_norm"] = grad_norm
        out[f"{prefix}/lr"] = lr
        out[f"{prefix}/skipped_updates"] = float(skipped)
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
    # Counts add up over the optimizer steps; everything else is their mean.
    return {
        k: sum(h[k] for h in history) / (1 if k.endswith("skipped_updates") else len(history))
        for k in history[0]
    }


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
    dist.all_reduce(totals)
    out = {
        k: totals[i].item() / (1.0 if k in SUMMED_METRICS else norm.global_tokens)
        for i, k in enumerate(keys)
    }
    out[f"{prefix}/loss"] = totals[-1].item()
    return out
