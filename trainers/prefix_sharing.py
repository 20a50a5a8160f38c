"""Prefix-shared micro-batches: samples of a micro-batch that begin with the same
tokens (the ``rollout.n`` samples of a prompt, the segments of a split agent
episode) run those tokens through the model once.

A packed micro-batch (``micro_batching.pack``) holds every sample whole, one after
the other. Shared, consecutive samples that begin alike (each shares at least
half of itself with the one before: a prompt's samples, an episode's segments)
form a tree, and each tree is one row of the forward pass: each distinct prefix
once, a token's position its depth, and an attention mask that lets each token
see its ancestors and nothing of the branches beside it. Every token then sees
exactly the context it has in its own sample, so the model's output at each
token equals the unshared computation; ``index_T`` gathers the trees' outputs
back into the packed layout, whose log-prob and loss code runs unchanged, and
the gather's backward adds up the gradients the samples send to their common
prefix. Trees are rows of their own (not one long row) so that attention, whose
cost grows with the square of a row's length, stays within a group.

Legend: b = samples, T = tokens of the packed row (the samples' lengths summed),
R = trees, L = tokens of the largest tree.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlpost.runtime.device import upload
from rlpost.trainers.batch import TrajectoryBatch
from rlpost.trainers.micro_batching import row_lengths

# prefix_sharing=auto shares a micro-batch when its trees' rows (padding
# included) hold at least this much fewer tokens than the unshared forward runs.
AUTO_MIN_SAVED = 0.2
# Attention implementations that take a custom (R, 1, L, L) mask as it is.
MASKED_ATTENTION = ("sdpa", "eager")


@dataclass(frozen=True)
class SharedRows:
    ids_RL: torch.Tensor
    pos_RL: torch.Tensor
    allowed_RLL: torch.Tensor  # bool: in tree r, token l may attend to token l'
    index_T: torch.Tensor  # each packed token's place in the trees, flattened (r * L + l)
    lengths: list[int]  # the samples' lengths, as ``pack`` returns them
    tree_tokens: int  # the trees' tokens, without the rows' padding

    @property
    def saved(self) -> float:
        """The share of the samples' tokens that the trees do not hold."""
        total = len(self.index_T)
        return 1.0 - self.tree_tokens / total if total else 0.0

    @property
    def size(self) -> int:
        """Tokens the forward pass runs: the trees' rows, padding included."""
        return self.ids_RL.numel()

    def attention_mask(self, implementation: str, dtype: torch.dtype) -> torch.Tensor:
        """The mask as the model's attention takes it: boolean for SDPA, additive
        (0 or the dtype's lowest value) for the eager implementation."""
        allowed = self.allowed_RLL[:, None]
        if implementation == "sdpa":
            return allowed
        lowest = torch.finfo(dtype).min
        return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, lowest)

    def gather(self, out_RL: torch.Tensor) -> torch.Tensor:
        """The trees' per-token outputs (R, L, ...) in the packed layout (1, T, ...)."""
        flat = out_RL.reshape(-1, *out_RL.shape[2:])
        return flat.index_select(0, self.index_T.to(flat.device))[None]


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` have in common."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass
class _Tree:
    tokens: list[int]
    parent: list[int]
    depth: list[int]
    children: dict[tuple[int, int], int]

    def add(self, row: list[int]) -> list[int]:
        """Walk ``row`` down the tree, growing it where the row leaves it; the row's
        tokens' places."""
        node, path = -1, []
        for d, token in enumerate(row):
            child = self.children.get((node, token))
            if child is None:
                child = self.children[(node, token)] = len(self.tokens)
                self.tokens.append(token)
                self.parent.append(node)
                self.depth.append(d)
            path.append(child)
            node = child
        return path

    def allowed(self, width: int) -> torch.Tensor:
        """(width, width): each token sees itself and its ancestors; padding sees itself."""
        allowed = torch.eye(width, dtype=torch.bool)
        parent = torch.tensor(self.parent, dtype=torch.long)
        depth = torch.tensor(self.depth, dtype=torch.long)
        # depth by depth (parents first), each token sees what its parent sees
        by_depth = torch.argsort(depth, stable=True)
        for nodes in torch.split(by_depth, torch.bincount(depth).tolist())[1:]:
            allowed[nodes] = allowed[parent[nodes]]
            allowed[nodes, nodes] = True
        return allowed


def share_prefixes(ids_bt: torch.Tensor, lengths: list[int]) -> SharedRows:
    """The trees of the right-padded rows ``ids_bt`` (``lengths`` tokens each): a
    row joins the tree of the row before it when the two share at least half of
    it; each tree holds its rows' distinct prefixes once, in the order the rows
    first reach them (a parent before its children)."""
    rows = [ids_bt[i, :n].tolist() for i, n in enumerate(lengths)]
    trees: list[_Tree] = []
    places: list[tuple[int, list[int]]] = []
    for i, row in enumerate(rows):
        if not trees or 2 * common_prefix(rows[i - 1], row) < max(len(row), 1):
            trees.append(_Tree([], [], [], {}))
        places.append((len(trees) - 1, trees[-1].add(row)))

    width = max(len(t.tokens) for t in trees)
    ids_RL = torch.zeros((len(trees), width), dtype=ids_bt.dtype)
    pos_RL = torch.zeros((len(trees), width), dtype=torch.long)
    for r, tree in enumerate(trees):
        ids_RL[r, : len(tree.tokens)] = torch.tensor(tree.tokens, dtype=ids_bt.dtype)
        pos_RL[r, : len(tree.tokens)] = torch.tensor(tree.depth, dtype=torch.long)
    return SharedRows(
        ids_RL=ids_RL,
        pos_RL=pos_RL,
        allowed_RLL=torch.stack([tree.allowed(width) for tree in trees]),
        index_T=torch.tensor([r * width + p for r, path in places for p in path], dtype=torch.long),
        lengths=list(lengths),
        tree_tokens=sum(len(t.tokens) for t in trees),
    )


def sliding_window(config: object) -> int | None:
    """The model's sliding attention window, or None where every layer sees every
    earlier token (transformers' ``layer_types``, else ``sliding_window``)."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    return window or None


def sharing_mode(mode: str, config: object, sequence_parallel: bool) -> str:
    """What ``prefix_sharing`` ``mode`` (off, on, auto) comes to for a model of
    ``config``: off where the model cannot run shared rows under auto, an error
    naming why under on."""
    if mode == "off":
        return "off"
    implementation = getattr(config, "_attn_implementation", "eager")
    window = sliding_window(config)
    why = None
    if sequence_parallel:
        why = "sequence parallelism gives each rank a slice of every sample"
    elif implementation not in MASKED_ATTENTION:
        why = (
            f"its attention implementation is {implementation!r}; prefix sharing needs one "
            f"that takes a custom mask ({', '.join(MASKED_ATTENTION)})"
        )
    elif window:  # a token would see other tokens in a tree than in its own sample
        why = f"it attends through a sliding window ({window} tokens)"
    if why is None:
        return mode
    if mode == "on":
        raise ValueError(
            f"prefix_sharing=on: {why}; set trainer.prefix_sharing=auto (shares where it can) or off"
        )
    return "off"


class PrefixSharing:
    """An engine's ``prefix_sharing``: the mode its model allows, and the trees of
    its current micro-batch (asked for by the forward pass and again by the
    log-probs)."""

    def __init__(self, mode: str, config: object, sequence_parallel: bool, packed: bool):
        self.mode = sharing_mode(mode, config, sequence_parallel)
        self.packed = packed  # what the unshared forward runs: the packed row, or padded rows
        self.attention = getattr(config, "_attn_implementation", "eager")
        self._last: tuple[TrajectoryBatch, SharedRows | None] | None = None
        self.tokens_run = 0  # tokens of the trees' rows run, against:
        self.tokens_unshared = 0  # what the unshared forward would have run

    def rows(self, mb: TrajectoryBatch) -> SharedRows | None:
        """``mb``'s trees where they run (``auto``: where they hold ``AUTO_MIN_SAVED``
        fewer tokens than the unshared forward runs), else None. Images are never
        shared."""
        if self.mode == "off" or mb.mm_inputs_b is not None:
            return None
        if self._last is not None and self._last[0] is mb:
            return self._last[1]
        rows = share_prefixes(mb.input_ids_bt, row_lengths(mb))
        unshared = len(rows.index_T) if self.packed else mb.input_ids_bt.numel()
        chosen = rows if self.mode == "on" or rows.size <= (1 - AUTO_MIN_SAVED) * unshared else None
        if chosen is not None:
            self.tokens_run += chosen.size
            self.tokens_unshared += unshared
        self._last = (mb, chosen)
        return chosen

    def inputs(
        self, trees: SharedRows, dtype: torch.dtype, device: torch.device
    ) -> dict[str, torch.Tensor]:
        """The model's keyword arguments for ``trees``."""
        return {
            "input_ids": upload(trees.ids_RL, device),
            "position_ids": upload(trees.pos_RL, device),
            "attention_mask": upload(trees.attention_mask(self.attention, dtype), device),
        }
