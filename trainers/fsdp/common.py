"""What the FSDP2 policy and critic engines share: sharding, and the backend the
shared update loop (``rlpost.trainers.update``) drives: micro-batched forward and
backward passes and AdamW.

Legend: b = samples, t = tokens.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import torch
import torch.distributed as dist

from rlpost.runtime import device as devices
from rlpost.runtime.spans import span
from rlpost.trainers.batch import TrajectoryBatch, join_shares
from rlpost.trainers.engine_config import EngineConfig
from rlpost.trainers.fsdp.ulysses import SequenceParallel
from rlpost.trainers.lr_schedule import lr_factor
from rlpost.trainers.update import OnOutput

log = logging.getLogger(__name__)


def shard(
    model: torch.nn.Module,
    layers: torch.nn.ModuleList,
    *,
    offload: bool = False,
    mixed_precision: str = "none",
) -> None:
    """FSDP2: one shard group per transformer layer (on one rank without offload,
    consecutive layers in groups under a memory budget: ``layer_groups``), then the
    rest of the model (with one rank and neither offload nor bf16, the model stays
    as it is).

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
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=devices.pin_memory())
    if mixed_precision == "bf16":
        on_cpu = next(model.parameters()).device.type == "cpu"
        if on_cpu and not devices.bf16_supported("cpu"):
            log.warning(
                "mixed_precision=bf16 on a CPU without bf16 instructions (avx512_bf16, AMX): "
                "slower than float32 here; set trainer.mixed_precision=none"
            )
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    elif mixed_precision != "none":
        raise ValueError(f"mixed_precision={mixed_precision!r}: expected 'none' or 'bf16'")
    groups = [[layer] for layer in layers]
    if dist.get_world_size() == 1 and not offload:
        # One rank holds every shard: gathering a layer again for its backward (and
        # casting it to bf16 again) buys no memory back, only time. (Offload keeps
        # the device free of every layer but the one running.)
        kwargs["reshard_after_forward"] = False
        # Nor does a group per layer overlap anything with communication; each group
        # only adds its hooks to every micro-batch's forward and backward.
        device_type = next(model.parameters()).device.type
        groups = layer_groups(layers, group_budget(device_type))
        log.info("FSDP2 on one rank: %d decoder layers in %d groups", len(layers), len(groups))
    for group in groups:
        fully_shard(group[0] if len(group) == 1 else group, **kwargs)
    fully_shard(model, **kwargs)


def group_budget(device_type: str) -> int:
    """The bytes of transient buffers one FSDP2 group may hold on one rank: the
    device's workspace (``rlpost.runtime.device.WORKSPACE_BYTES``)."""
    return devices.workspace_bytes(device_type)


def layer_groups(layers: torch.nn.ModuleList, budget: int) -> list[list[torch.nn.Module]]:
    """Consecutive ``layers`` in groups whose parameters take at most ``budget`` bytes
    at 8 bytes each, one layer at least per group.

    On one rank FSDP2's gradient "reduction" of a group copies its float32
    gradients into a buffer and out again, 8 bytes a parameter at once (its
    gather of the bf16 weights, once a step, 4): a group per layer holds one
    layer's worth, a group for the whole model would hold 4 GB at 0.5B. A group
    is reduced after its layers' backward, which has freed their activations,
    usually more than that. Fewer groups mean fewer hooks: every group runs four
    of them in each micro-batch.
    """
    groups: list[list[torch.nn.Module]] = []
    held = budget  # the bytes the last group holds: a full one starts the next
    for layer in layers:
        size = 8 * sum(p.numel() for p in layer.parameters())
        if held + size > budget:
            groups.append([])
            held = 0
        groups[-1].append(layer)
        held += size
    return groups


class FSDPBackend:
    """An FSDP2 model's forward passes and its AdamW step (linear LR warm-up, gradient
    clipping), for the shared update loop (``rlpost.trainers.update.Backend``).

    ``split`` cuts this rank's batch into micro-batches and ``output`` runs the
    model on one (the policy's logits, the critic's values). ``optim``: the engine's
    config, whose optimizer and learning-rate settings it reads; None: a frozen
    reference policy, without optimizer state. ``sp`` (``trainer.ulysses``):
    the ranks of a sequence-parallel group run their shares joined, each holding a
    slice of every sequence. ``offload``: the parameters live on the host
    (``CPUOffloadPolicy``).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        world_size: int,
        split: Callable[[TrajectoryBatch], list[TrajectoryBatch]],
        output: Callable[[TrajectoryBatch], torch.Tensor],
        optim: EngineConfig | None,
        sp: SequenceParallel | None = None,
        offload: bool = False,
    ):
        self.model, self.world_size = model, world_size
        # one rank, parameters on the device: micro-batches accumulate beside the
        # gathered layers (``_accumulate_locally``)
        self.accumulates_locally = world_size == 1 and not offload
        self.split, self.output, self.sp = split, output, sp
        self.max_grad_norm = optim.max_grad_norm if optim else 0.0
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        if optim is None:
            return
        o = optim
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params,
            lr=optim.lr,
            betas=optim.betas,
            weight_decay=optim.weight_decay,
            # one kernel for every tensor's step on an accelerator, not ~10 per tensor
            fused=bool(params) and devices.fused_optimizer(params[0].device.type),
        )
        # A fresh Adam moves every weight by ~lr on its first steps whatever the
        # gradient's size; a linear warm-up keeps that from wrecking a tuned model.
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda step: lr_factor(
                step, o.lr_warmup_steps, o.lr_schedule, o.lr_decay_steps, o.lr_min_ratio
            ),
        )

    @property
    def trainable(self) -> bool:
        return self.optimizer is not None

    @property
    def reports_metrics(self) -> bool:
        """Every rank holds a batch of its own; a sequence-parallel group's first rank
        reports the group's joined batch."""
        return self.sp is None or self.sp.rank == 0

    def forward(self, batch: TrajectoryBatch, on_output: OnOutput, *, grad: bool) -> torch.Tensor:
        self.model.train(grad)
        data, first = (batch, 0) if self.sp is None else join_shares(batch, self.sp.group)
        # each micro-batch's rows stay on the device until the last is done: copying
        # them to the host would wait for its backward pass before the next forward
        handed: list[tuple[int, torch.Tensor]] = []
        start = 0
        mbs = self.split(data)
        with torch.set_grad_enabled(grad):
            for i, mb in enumerate(mbs):
                if grad:
                    self._accumulate_locally(last=i == len(mbs) - 1)
                with span("forward", cat="micro", level="full", samples=len(mb)):
                    loss, rows = on_output(mb, self.output(mb))
                if grad:
                    # FSDP averages gradients over ranks; the loss is already a
                    # global mean, so undo the average. (A sequence-parallel group's
                    # ranks each compute its joined loss and back-propagate their
                    # slice of it: their gradients add up to its gradient.)
                    with span("backward", cat="micro", level="full", samples=len(mb)):
                        (loss * self.world_size).backward()
                if rows is not None:
                    handed.append((start, rows.detach()))
                start += len(mb)
        rows_bt = torch.zeros(data.input_ids_bt.shape, dtype=torch.float32)
        for start, rows in handed:
            rows_bt[start : start + len(rows), : rows.shape[1]] = rows.cpu()
        return rows_bt[first : first + len(batch), : batch.input_ids_bt.shape[1]]

    def _accumulate_locally(self, last: bool) -> None:
        """On one rank, FSDP2 adds each micro-batch's gradients in float32 beside the
        gathered layers and reduces (a copy, on one rank) once, after the last
        micro-batch; the layers stay gathered until then instead of being gathered
        again for every micro-batch. The accumulation holds as much memory as the
        reduced gradients would. Several ranks reduce every micro-batch: their
        accumulated gradients would be the whole model's on each rank."""
        from torch.distributed.fsdp import FSDPModule

        if self.world_size == 1 and isinstance(self.model, FSDPModule):
            self.model.set_requires_gradient_sync(last)
            self.model.set_reshard_after_backward(last)

    def zero_grad(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)

    def optimizer_step(self) -> tuple[float, float, bool]:
        assert self.optimizer is not None and self.scheduler is not None
        norm_t = torch.nn.utils.clip_grad_norm_(
            [p for p in self.model.parameters() if p.requires_grad], self.max_grad_norm
        )
        grad_norm = float(norm_t.full_tensor() if hasattr(norm_t, "full_tensor") else norm_t)
        lr = float(self.scheduler.get_last_lr()[0])
        skipped = not math.isfinite(grad_norm)
        if skipped:
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.optimizer.step()
            self.scheduler.step()
        return grad_norm, lr, skipped

    def metric_keys(self, keys: list[str]) -> list[str]:
        return keys  # every rank computes every metric
