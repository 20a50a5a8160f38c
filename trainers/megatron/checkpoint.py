"""Megatron engine checkpoints: every rank's parameters, optimizer state and step
count, inside the layout of ``rlpost.trainers.checkpointing``; they load back into
the same parallel layout.

    D/engine.json     engine config and world size
    D/rank{r}.pt      rank r's parameters (model-wide Megatron names, its
                      tensor-parallel slice of each; under pipeline parallelism
                      its stage's layers only), the Adam state of the parameters
                      its optimizer steps (with the distributed optimizer: its
                      shard), steps, RNG state

``full_weights`` reads the whole model back from the rank files with no
process group (``python -m rlpost.export``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from rlpost.trainers.files import safe_torch_load
from rlpost.trainers.megatron import cpu_shim
from rlpost.trainers.megatron.convert import tp_merge
from rlpost.trainers.megatron.model import MegatronModel


class MegatronState:
    """A ``MegatronModel``'s parameters, optimizer and steps, as a ``CheckpointState``."""

    def __init__(self, m: MegatronModel):
        self.m = m
        self.config, self.rank, self.world_size = m.cfg, m.rank, m.world_size

    @cpu_shim.runs_on_cpu
    def write(self, tmp: Path) -> tuple[dict[str, object], dict[str, object]]:
        m = self.m
        own: dict[str, object] = {
            "model": {n: p.detach().clone() for n, p in m.local_params().items()},
            "steps": m.steps,
        }
        if m.optimizer is not None:
            own["optimizer"] = [adam.state_dict() for adam in _adams(m)]
        return own, {}

    def check(self, path: Path, meta: dict[str, Any]) -> None:
        m = self.m
        saved = meta["config"]["parallel"]
        here = dataclasses.asdict(m.cfg.parallel)
        if meta["world_size"] != m.world_size or saved != here:
            raise ValueError(
                f"{path}: written by {meta['world_size']} ranks with {saved}; this engine has "
                f"{m.world_size} ranks with {here}: resume with the same "
                "trainer.world_size and trainer.megatron settings"
            )

    @cpu_shim.runs_on_cpu
    def read(self, path: Path, meta: dict[str, Any], own: dict[str, Any]) -> None:
        m = self.m
        with torch.no_grad():
            for name, param in m.local_params().items():
                param.copy_(own["model"][name])
        if m.optimizer is not None and "optimizer" in own:
            for adam, adam_state in zip(_adams(m), own["optimizer"], strict=True):
                adam.load_state_dict(adam_state)
        m.steps = own["steps"]


def _adams(m: MegatronModel) -> list[torch.optim.Optimizer]:
    """The torch optimizers inside megatron's (one per chained optimizer). Each holds
    this rank's Adam state whole: the distributed optimizer's steps only its shard
    (views of the float32 parameters), so a rank's state loads back into the same
    layout without gathering it anywhere."""
    opt = m.optimizer
    return [sub.optimizer for sub in getattr(opt, "chained_optimizers", [opt])]


def full_weights(path: str | Path, meta: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The model's full Megatron tensors (model-wide names, every tensor whole, as
    ``MegatronModel.gathered_state`` gives them) from checkpoint ``path`` with
    ``engine.json`` ``meta``, read rank file by rank file, with no process group.

    Tensor-parallel slices are merged (``convert.tp_merge``); pipeline stages and
    expert-parallel ranks hold disjoint names, data- and context-parallel ranks
    copies. A rank's tensor-parallel rank is ``rank % tp``: megatron's rank order
    (``tp-cp-ep-dp-pp``, what ``MegatronModel`` initialises) puts the tp ranks of
    one group next to each other.
    """
    tp = meta["config"]["parallel"]["tp"]
    shards: dict[str, dict[int, torch.Tensor]] = {}
    for rank in range(meta["world_size"]):
        own = safe_torch_load(Path(path) / f"rank{rank}.pt")["model"]  # Adam state dropped
        for name, tensor in own.items():
            shards.setdefault(name, {}).setdefault(rank % tp, tensor)
    return {name: tp_merge(name, [by_tp[r] for r in range(tp)]) for name, by_tp in shards.items()}
