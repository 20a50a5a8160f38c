"""Megatron engine checkpoints: every rank's parameters, optimizer state, step count
and RNG state, written atomically; they load back into the same parallel layout.

Layout of a checkpoint directory ``D``::

    D/engine.json     engine config and world size
    D/rank{r}.pt      rank r's parameters (model-wide Megatron names), the Adam
                      state of the parameters its optimizer steps (with the
                      distributed optimizer: its shard), steps, RNG state

Every rank writes into ``D.partial``; after a barrier rank 0 renames it to ``D``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rlpost.trainers.files import safe_torch_load
from rlpost.trainers.fsdp.state import PARTIAL_SUFFIX, rng_state, set_rng_state
from rlpost.trainers.megatron.model import MegatronModel


def save(m: MegatronModel, path: str) -> str:
    """Write ``m``'s state to ``path``, atomically. Collective."""
    final = Path(path)
    tmp = final.with_name(final.name + PARTIAL_SUFFIX)
    if m.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    state: dict[str, Any] = {
        "model": {n: p.detach().clone() for n, p in m.local_params().items()},
        "steps": m.steps,
        "rng": rng_state(),
    }
    if m.optimizer is not None:
        state["optimizer"] = [adam.state_dict() for adam in _adams(m)]
    torch.save(state, tmp / f"rank{m.rank}.pt")
    if m.rank == 0:
        meta = {"config": dataclasses.asdict(m.cfg), "world_size": m.world_size}
        (tmp / "engine.json").write_text(json.dumps(meta, indent=1))
    dist.barrier()
    if m.rank == 0:
        old = final.with_name(final.name + ".old")
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return str(final)


def load(m: MegatronModel, path: str) -> None:
    """Restore ``save``'s state into the freshly built ``m``. Collective."""
    meta = json.loads((Path(path) / "engine.json").read_text())
    saved = meta["config"]["parallel"]
    here = dataclasses.asdict(m.cfg.parallel)
    if meta["world_size"] != m.world_size or saved != here:
        raise ValueError(
            f"{path}: written by {meta['world_size']} ranks with {saved}; this engine has "
            f"{m.world_size} ranks with {here}: resume with the same "
            "trainer.world_size and trainer.megatron settings"
        )
    state = safe_torch_load(Path(path) / f"rank{m.rank}.pt")
    with torch.no_grad():
        for name, param in m.local_params().items():
            param.copy_(state["model"][name])
    if m.optimizer is not None and "optimizer" in state:
        for adam, adam_state in zip(_adams(m), state["optimizer"], strict=True):
            adam.load_state_dict(adam_state)
    m.steps = state["steps"]
    set_rng_state(state["rng"])
    dist.barrier()


def _adams(m: MegatronModel) -> list[torch.optim.Optimizer]:
    """The torch optimizers inside megatron's (one per chained optimizer). Each holds
    this rank's Adam state whole: the distributed optimizer's steps only its shard
    (views of the float32 parameters), so a rank's state loads back into the same
    layout without gathering it anywhere."""
    opt = m.optimizer
    return [sub.optimizer for sub in getattr(opt, "chained_optimizers", [opt])]
