"""The trajectory batch that flows from the controller to the training engines.

Legend: b = samples, t = tokens (prompt + response, right-padded).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F


@dataclass
class TrajectoryBatch:
    """Padded tensors for one step; every tensor has leading dim b.

    ``response_mask_bt`` is 1 on tokens the model generated (the ones that get a
    loss) and 0 on prompt tokens and padding. Log-prob tensors are aligned with
    ``input_ids_bt``: position t holds log p(token_t | tokens_<t); position 0
    is always 0.
    """

    input_ids_bt: torch.Tensor
    attention_mask_bt: torch.Tensor
    response_mask_bt: torch.Tensor
    rollout_logp_bt: torch.Tensor | None = None
    old_logp_bt: torch.Tensor | None = None
    ref_logp_bt: torch.Tensor | None = None
    advantages_bt: torch.Tensor | None = None
    returns_bt: torch.Tensor | None = None
    old_values_bt: torch.Tensor | None = None
    scores_b: dict[str, torch.Tensor] = field(default_factory=dict)
    group_ids_b: torch.Tensor | None = None
    # Vision-language samples: each sample's image-processor outputs
    # (``pixel_values``, ``image_grid_thw``, ...); None for text.
    mm_inputs_b: list[dict[str, torch.Tensor]] | None = None
    # Samples that belong to another sample's episode (an agent program's trajectory
    # split by prefix breaks): ``owner_b[i]`` is the row of the episode's own sample
    # (``i`` for that sample), -1 a row that only pads the batch to split over the
    # ranks (no response tokens, not counted as a sample). None: each row is its own
    # episode. Row indices hold only in the batch as built (not after ``select``).
    owner_b: torch.Tensor | None = None

    @property
    def real_samples(self) -> int:
        """Rows that are samples (padding rows not counted)."""
        if self.owner_b is None:
            return len(self)
        return int((self.owner_b >= 0).sum())

    def __len__(self) -> int:
        return int(self.input_ids_bt.shape[0])

    def tensor_fields(self) -> dict[str, torch.Tensor]:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                out[f.name] = value
        return out

    def select(self, index: torch.Tensor | slice) -> TrajectoryBatch:
        """Rows ``index`` of every tensor (scores included)."""
        updates: dict[str, object] = {k: v[index] for k, v in self.tensor_fields().items()}
        updates["scores_b"] = {k: v[index] for k, v in self.scores_b.items()}
        if self.mm_inputs_b is not None:
            rows = range(len(self))[index] if isinstance(index, slice) else index.tolist()
            if isinstance(index, torch.Tensor) and index.dtype == torch.bool:
                rows = index.nonzero().flatten().tolist()
            updates["mm_inputs_b"] = [self.mm_inputs_b[i] for i in rows]
        return replace(self, **updates)  # type: ignore[arg-type]

    def trim(self) -> TrajectoryBatch:
        """Drop trailing columns that are padding in every row."""
        length = int(self.attention_mask_bt.sum(dim=1).max().item())
        updates: dict[str, object] = {}
        for k, v in self.tensor_fields().items():
            updates[k] = v[:, :length] if v.dim() == 2 else v
        return replace(self, **updates)  # type: ignore[arg-type]

    def shard(self, rank: int, world_size: int) -> TrajectoryBatch:
        """Contiguous share of rows for one data-parallel rank."""
        b = len(self)
        if b % world_size:
            raise ValueError(f"batch of {b} samples does not split over {world_size} ranks")
        per = b // world_size
        return self.select(slice(rank * per, (rank + 1) * per))


def pad_sequences(seqs: list[list[int]], pad_id: int) -> torch.Tensor:
    """Right-pad lists of ints into a (b, t) long tensor."""
    width = max(len(s) for s in seqs)
    out = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def join_shares(
    batch: TrajectoryBatch, group: dist.ProcessGroup | None
) -> tuple[TrajectoryBatch, int]:
    """Every rank's ``batch`` of ``group`` in rank order, and where this rank's rows start."""
    size = dist.get_world_size(group)
    if size == 1:
        return batch, 0
    shares: list[Any] = [None] * size  # placeholders all_gather_object fills
    dist.all_gather_object(shares, batch, group=group)
    me = dist.get_rank(group)
    width = max(s.input_ids_bt.shape[1] for s in shares)
    joined = concat([pad_width(s, width) for s in shares])
    return joined, sum(len(s) for s in shares[:me])


def pad_width(batch: TrajectoryBatch, width: int) -> TrajectoryBatch:
    """Right-pad every (b, t) tensor of ``batch`` with zeros to ``width`` columns."""
    t = batch.input_ids_bt.shape[1]
    if t == width:
        return batch
    updates = {
        k: F.pad(v, (0, width - t)) if v.dim() == 2 else v for k, v in batch.tensor_fields().items()
    }
    return replace(batch, **updates)  # type: ignore[arg-type]


def concat(parts: list[TrajectoryBatch]) -> TrajectoryBatch:
    """Rows of every part, in order (same widths)."""
    first = parts[0]
    updates: dict[str, Any] = {
        k: torch.cat([getattr(p, k) for p in parts]) for k in first.tensor_fields()
    }
    updates["scores_b"] = {k: torch.cat([p.scores_b[k] for p in parts]) for k in first.scores_b}
    return replace(first, **updates)
