"""Prefix-shared micro-batches: samples of a micro-batch that begin with the same
tokens (the ``rollout.n`` samples of a prompt, the segments of a split agent
episode) run those tokens through the model once.

A packed micro-batch (``micro_batching.pack``) holds every sample whole, one after
the other. The shared row holds the samples' prefix tree: each distinct prefix
once (a prompt before its samples' answers; an episode's first turns before the
segments that continue them; a system prompt every sample begins with), a token's
position is its depth, and an attention mask lets each token see its ancestors
and nothing of the branches beside it. Every token then sees exactly the context
it has in its own sample, so the model's output at each token equals the
unshared computation; ``index_T`` gathers the shared row's outputs back into the
packed layout, whose log-prob and loss code runs unchanged, and the gather's
backward adds up the gradients that the samples send to their common prefix.

Legend: b = samples, T = tokens of the packed row (the samples' lengths summed),
S = tokens of the shared row (S <= T).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlpost.trainers.batch import TrajectoryBatch
from rlpost.trainers.micro_batching import row_lengths

# prefix_sharing=auto shares a micro-batch when the shared row is at least this
# much shorter than the packed one.
AUTO_MIN_SAVED = 0.2
# Attention implementations that take a custom (1, 1, S, S) mask as it is.
MASKED_ATTENTION = ("sdpa", "eager")


@dataclass(frozen=True)
class SharedRow:
    ids_1S: torch.Tensor
    pos_1S: torch.Tensor
    allowed_SS: torch.Tensor  # bool: query s may attend to key s'
    index_T: torch.Tensor  # each packed token's place in the shared row
    lengths: list[int]  # the samples' lengths, as ``pack`` returns them

    @property
    def saved(self) -> float:
        """The share of the packed row's tokens the shared row does not run."""
        total = len(self.index_T)
        return 1.0 - self.ids_1S.shape[1] / total if total else 0.0

    def attention_mask(self, implementation: str, dtype: torch.dtype) -> torch.Tensor:
        """The mask as the model's attention takes it: boolean for SDPA, additive
        (0 or the dtype's lowest value) for the eager implementation."""
        allowed = self.allowed_SS[None, None]
        if implementation == "sdpa":
            return allowed
        lowest = torch.finfo(dtype).min
        return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, lowest)


def share_prefixes(ids_bt: torch.Tensor, lengths: list[int]) -> SharedRow:
    """The shared row of the right-padded rows ``ids_bt`` (``lengths`` tokens each):
    the prefix tree of the rows, each node a token, in the order the rows first
    reach it (a parent before its children). A token's position is its depth; it
    attends to itself and its ancestors, which are exactly the tokens before it in
    every row that passes through it."""
    children: dict[tuple[int, int], int] = {}
    tokens: list[int] = []
    parent: list[int] = []
    depth: list[int] = []
    places: list[list[int]] = []
    for i, n in enumerate(lengths):
        node, path = -1, []
        for d, token in enumerate(ids_bt[i, :n].tolist()):
            child = children.get((node, token))
            if child is None:
                child = children[(node, token)] = len(tokens)
                tokens.append(token)
                parent.append(node)
                depth.append(d)
            path.append(child)
            node = child
        places.append(path)

    size = len(tokens)
    parent_S, depth_S = (
        torch.tensor(parent, dtype=torch.long),
        torch.tensor(depth, dtype=torch.long),
    )
    allowed_SS = torch.eye(size, dtype=torch.bool)
    # depth by depth, each node sees what its parent sees, and itself
    by_depth = torch.argsort(depth_S, stable=True)
    for nodes in torch.split(by_depth, torch.bincount(depth_S).tolist())[1:]:
        allowed_SS[nodes] = allowed_SS[parent_S[nodes]]
        allowed_SS[nodes, nodes] = True
    return SharedRow(
        ids_1S=torch.tensor(tokens, dtype=ids_bt.dtype)[None],
        pos_1S=depth_S[None],
        allowed_SS=allowed_SS,
        index_T=torch.tensor([p for path in places for p in path], dtype=torch.long),
        lengths=list(lengths),
    )


def padded_rows(values_T: torch.Tensor, lengths: list[int], width: int) -> torch.Tensor:
    """Per-token values of the packed layout (T,) as right-padded rows (b, width), 0 in
    padding, nothing shifted."""
    return torch.stack(
        [F.pad(row, (0, width - len(row))) for row in torch.split(values_T, lengths)]
    )


def sliding_window(config: object) -> int | None:
    """The model's sliding attention window, or None where every layer sees every
    earlier token (transformers' ``layer_types``, else ``sliding_window``)."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    return window or None


def sharing_refusal(implementation: str, sliding_window: int | None) -> str | None:
    """Why a model cannot run shared rows, or None: its attention must take a custom
    mask, and it must attend to every earlier token (a sliding window would see
    other tokens in a shared row than in its own sample)."""
    if implementation not in MASKED_ATTENTION:
        return (
            f"its attention implementation is {implementation!r}; prefix sharing needs one "
            f"that takes a custom mask ({', '.join(MASKED_ATTENTION)})"
        )
    if sliding_window:
        return f"it attends through a sliding window ({sliding_window} tokens)"
    return None


def sharing_mode(mode: str, config: object, sequence_parallel: bool) -> str:
    """What ``prefix_sharing`` ``mode`` (off, on, auto) comes to for a model of
    ``config``: off where the model cannot run shared rows under auto, an error
    naming why under on."""
    if mode == "off":
        return "off"
    why = (
        "sequence parallelism gives each rank a slice of every sample"
        if sequence_parallel
        else sharing_refusal(
            getattr(config, "_attn_implementation", "eager"), sliding_window(config)
        )
    )
    if why is None:
        return mode
    if mode == "on":
        raise ValueError(
            f"prefix_sharing=on: {why}; set trainer.prefix_sharing=auto (shares where it can) or off"
        )
    return "off"


class PrefixSharing:
    """An engine's ``prefix_sharing``: the mode its model allows, and the shared row
    of its current micro-batch (asked for by the forward pass and again by the
    log-probs)."""

    def __init__(self, mode: str, config: object, sequence_parallel: bool):
        self.mode = sharing_mode(mode, config, sequence_parallel)
        self.attention = getattr(config, "_attn_implementation", "eager")
        self._last: tuple[TrajectoryBatch, SharedRow | None] | None = None
        self.tokens_run = 0  # tokens of the shared rows run, against:
        self.tokens_packed = 0  # their samples' tokens

    def row(self, mb: TrajectoryBatch) -> SharedRow | None:
        """``mb``'s shared row where it runs as one (``auto``: where that saves
        ``AUTO_MIN_SAVED`` of its tokens), else None. Images are never shared."""
        if self.mode == "off" or mb.mm_inputs_b is not None:
            return None
        if self._last is not None and self._last[0] is mb:
            return self._last[1]
        row = share_prefixes(mb.input_ids_bt, row_lengths(mb))
        chosen = row if self.mode == "on" or row.saved >= AUTO_MIN_SAVED else None
        if chosen is not None:
            self.tokens_run += chosen.ids_1S.shape[1]
            self.tokens_packed += len(chosen.index_T)
        self._last = (mb, chosen)
        return chosen

    def inputs(
        self, row: SharedRow, dtype: torch.dtype, device: torch.device
    ) -> dict[str, torch.Tensor]:
        """The model's keyword arguments for ``row``."""
        return {
            "input_ids": row.ids_1S.to(device),
            "position_ids": row.pos_1S.to(device),
            "attention_mask": row.attention_mask(self.attention, dtype).to(device),
        }
