"""Batches through megatron's forward-backward schedule: the model-parallel group's
data-parallel batch, each micro-batch's inputs, and results moved off the last
pipeline stage.

Legend: b = samples, t = tokens, T = tokens of one packed row. ``mpu``: megatron-core's
``parallel_state`` module, as ``MegatronModel`` holds it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from types import ModuleType
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from rlpost.runtime.device import upload
from rlpost.trainers.batch import TrajectoryBatch, join_shares, pad_width
from rlpost.trainers.distributed import broadcast_
from rlpost.trainers.megatron.context_parallel import gather_output, pad_inputs, split_inputs
from rlpost.trainers.micro_batching import pack

R = TypeVar("R", bound=torch.Tensor | None)

# What the last stage does with one micro-batch's model output: (loss, result). The
# losses are summed and back-propagated; the results are returned in order
# (``rlpost.trainers.update.OnOutput`` is one, its results rows or None).
StageOutput = Callable[[TrajectoryBatch, torch.Tensor], tuple[torch.Tensor, R]]


def dp_batch(batch: TrajectoryBatch, mpu: ModuleType) -> tuple[TrajectoryBatch, slice]:
    """The model-parallel group's shares joined into one batch, and this rank's rows.

    The ranks of one model copy (tp x pp x cp ranks holding it between them) must
    all see the same samples: the shares are joined over the context-parallel
    group, then over the tensor x pipeline group. Collective in those groups.
    """
    start, rows = 0, len(batch)
    for group in (mpu.get_context_parallel_group(), mpu.get_model_parallel_group()):
        batch, offset = join_shares(batch, group)
        start += offset
    return batch, slice(start, start + rows)


def model_inputs(mb: TrajectoryBatch, packing: bool) -> tuple[torch.Tensor, ...]:
    """Token ids, positions and the boolean attention mask (True: masked) of ``mb``.

    Padded rows use one causal mask; right padding only follows real tokens,
    so real tokens never see it. A packed row's mask is block-diagonal:
    causal within a sample, nothing across samples.
    """
    if packing:
        ids_1T, pos_1T, lengths = pack(mb)
        sample_T = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
        same_TT = sample_T[:, None] == sample_T[None, :]
        causal_TT = torch.ones_like(same_TT).tril()
        return ids_1T, pos_1T, ~(same_TT & causal_TT)[None, None]
    b, t = mb.input_ids_bt.shape
    pos_bt = torch.arange(t).expand(b, t)
    mask_11tt = torch.ones(t, t, dtype=torch.bool).triu(1)[None, None]
    return mb.input_ids_bt, pos_bt, mask_11tt


def run_schedule(
    chunks: list[torch.nn.Module],
    mbs: list[TrajectoryBatch],
    on_output: StageOutput[R],
    packing: bool,
    mpu: ModuleType,
    device: torch.device,
    sequence_parallel: bool = False,
) -> list[R]:
    """Forward (and, with grad enabled, backward) of the model ``chunks`` over ``mbs``
    through megatron's schedule (1F1B across pipeline stages, interleaved over
    virtual stages when there are several chunks); returns ``on_output``'s results
    on the last pipeline stage, an empty list elsewhere.

    Context parallelism and sequence parallelism split each sequence over ranks,
    so it is padded at the end to a multiple of 2 x cp (x tp with sequence
    parallelism); each cp rank runs its part, the last stage gathers the output
    whole (``context_parallel``) and drops the padding. The inputs are built on the
    host and reach ``device`` (the model's) just before its forward.
    """
    from megatron.core.pipeline_parallel import get_forward_backward_func

    cp_group = mpu.get_context_parallel_group()
    cp = dist.get_world_size(cp_group)
    multiple = (2 * cp if cp > 1 else 1) * (
        mpu.get_tensor_model_parallel_world_size() if sequence_parallel else 1
    )

    # Interleaved stages (several chunks) send fixed shapes: megatron's exchange of
    # shapes at pp = 2 can pair a forward's with a backward's. Every micro-batch is
    # padded to the same rows and width (zero rows and columns, no loss, results cut).
    interleaved = len(chunks) > 1
    real_rows = [len(mb) for mb in mbs]
    if interleaved:
        width = max(mb.input_ids_bt.shape[1] for mb in mbs)
        mbs = [_pad_rows(pad_width(mb, width), max(real_rows)) for mb in mbs]

    def forward_step(data, model):
        mb, rows = next(data)
        ids, pos, mask = model_inputs(mb, packing)
        length = ids.shape[1]
        ids, pos, mask = pad_inputs(ids, pos, mask, multiple)
        if cp > 1:
            ids, pos = split_inputs(ids, pos, cp_group)
        ids, pos, mask = (upload(x, device) for x in (ids, pos, mask))
        out = model(ids, pos, attention_mask=mask)
        if getattr(model, "module", model).post_process:  # the model's last chunk
            out = (gather_output(out, cp_group) if cp > 1 else out)[:, :length]

        def loss_func(output):
            loss, result = on_output(mb, output)
            kept = result[:rows] if isinstance(result, torch.Tensor) else result
            return loss, torch.tensor(0, dtype=torch.int), kept

        return out, loss_func

    def data():
        return iter(list(zip(mbs, real_rows)))

    return get_forward_backward_func()(
        forward_step_func=forward_step,
        # every chunk reads the micro-batches (its mask, and its inputs on the first)
        data_iterator=[data() for _ in chunks] if interleaved else data(),
        model=chunks,
        num_microbatches=len(mbs),
        # the whole padded sequence: megatron divides it by cp (and tp under sequence
        # parallelism); only the interleaved schedule reads it
        seq_length=max(-(-mb.input_ids_bt.shape[1] // multiple) * multiple for mb in mbs),
        micro_batch_size=max(real_rows),
        forward_only=not torch.is_grad_enabled(),
    )


def rows_from_last_stage(
    mbs: list[TrajectoryBatch],
    pieces: list[torch.Tensor | None],
    shape: torch.Size,
    mpu: ModuleType,
    pp: int,
) -> torch.Tensor:
    """The per-micro-batch (rows, width) ``pieces`` of the last stage laid out as one
    (b, t) tensor of ``shape`` (zeros past each piece's width, and for a None piece),
    on every stage."""
    out = torch.zeros(shape, dtype=torch.float32)
    if mpu.is_pipeline_last_stage():
        row = 0
        for mb, piece in zip(mbs, pieces):
            if piece is not None:
                piece = piece[: len(mb)]  # an interleaved schedule's padding rows
                out[row : row + len(mb), : piece.shape[1]] = piece
            row += len(mb)
    return from_last_stage(out, mpu, pp)


def from_last_stage(tensor: torch.Tensor, mpu: ModuleType, pp: int) -> torch.Tensor:
    """``tensor`` as the last pipeline stage has it, on every stage."""
    if pp == 1:
        return tensor
    src = mpu.get_pipeline_model_parallel_last_rank()
    return broadcast_(tensor, src, mpu.get_pipeline_model_parallel_group())


def all_keys(keys: list[str]) -> list[str]:
    """The union of every rank's metric names, in one order (ranks off the last stage have none)."""
    everyone: list[Any] = [None] * dist.get_world_size()  # placeholders all_gather_object fills
    dist.all_gather_object(everyone, keys)
    return sorted({k for ks in everyone for k in ks})


def _pad_rows(batch: TrajectoryBatch, rows: int) -> TrajectoryBatch:
    """``batch`` with zero rows appended up to ``rows`` (every mask 0 there)."""
    extra = rows - len(batch)
    if extra == 0:
        return batch

    def pad(v: torch.Tensor) -> torch.Tensor:
        return torch.cat([v, v.new_zeros((extra, *v.shape[1:]))])

    updates: dict[str, Any] = {k: pad(v) for k, v in batch.tensor_fields().items()}
    updates["scores_b"] = {k: pad(v) for k, v in batch.scores_b.items()}
    return replace(batch, **updates)
