"""How an engine cuts a batch into micro-batches, and packs a micro-batch's rows into
one unpadded row.

Legend: b = samples, t = tokens, T = tokens of one packed row.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlpost.trainers.batch import TrajectoryBatch


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
    pos = torch.cat([torch.arange(n) for n in lengths])
    return packed_values(mb.input_ids_bt, lengths), pos[None], lengths


def packed_values(values_bt: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """Per-token values of right-padded rows laid out as ``pack`` lays out their
    tokens: (b, t) -> (1, sum of lengths)."""
    return torch.cat([values_bt[i, :n] for i, n in enumerate(lengths)])[None]


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


def padded_rows(values_T: torch.Tensor, lengths: list[int], width: int) -> torch.Tensor:
    """``unpack`` keeping each row's position 0: per-token values of the packed
    layout (T,) as right-padded rows (b, width), 0 in padding."""
    return torch.stack(
        [F.pad(row, (0, width - len(row))) for row in torch.split(values_T, lengths)]
    )
