"""Engine checkpoints: sharded model and optimizer (torch.distributed.checkpoint),
LR schedule and per-rank RNG states, written atomically.

Layout of a checkpoint directory ``D``::

    D/engine.json      engine config, world size, which parts are present
    D/state/           DCP files: {"model": ..., "optim": ...}, one shard per rank
    D/rank{r}.pt       LR scheduler and RNG states of rank r

Every rank writes into ``D.partial``; after a barrier rank 0 renames it to
``D``, so ``D`` either exists complete or not at all (a shared filesystem is
assumed when ranks sit on several nodes). DCP reshards on load, so a
checkpoint written by N ranks loads into M; RNG states then come from rank 0.
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
from rlpost.trainers.files import check_dcp_metadata, safe_torch_load

PARTIAL_SUFFIX = ".partial"


def _options(frozen_base: bool):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # With LoRA the base weights never change: they come from the model path,
    # and only the adapter (the trainable parameters) is saved.
    return StateDictOptions(ignore_frozen_params=frozen_base, strict=not frozen_base)


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save_engine(
    path: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any | None,
    config: Any,
    rank: int,
    world_size: int,
    frozen_base: bool,
) -> Path:
    """Write one engine's state to ``path`` atomically. Collective: every rank calls it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    final = Path(path)
    tmp = final.with_name(final.name + PARTIAL_SUFFIX)
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    # An optimizer that never stepped has no state; DCP would create it with a
    # zero-lr step (which advances Adam's step count), so it is left out.
    with_optim = optimizer is not None and bool(optimizer.state)
    opts = _options(frozen_base)
    if with_optim:
        assert optimizer is not None
        model_sd, optim_sd = get_state_dict(model, optimizer, options=opts)
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
    else:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        state = {"model": get_model_state_dict(model, options=opts)}
    dcp.save(state, checkpoint_id=str(tmp / "state"))
    torch.save(
        {
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "rng": rng_state(),
        },
        tmp / f"rank{rank}.pt",
    )
    if rank == 0:
        meta = {
            "config": dataclasses.asdict(config),
            "world_size": world_size,
            "optimizer": with_optim,
            "frozen_base": frozen_base,
        }
        (tmp / "engine.json").write_text(json.dumps(meta, indent=1))
    dist.barrier()
    if rank == 0:
        old = final.with_name(final.name + ".old")
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def read_meta(path: str | Path) -> dict[str, Any]:
    meta_path = Path(path) / "engine.json"
    if not meta_path.exists():
        raise FileNotFoundError(f"{path}: not an engine checkpoint (no engine.json)")
    return json.loads(meta_path.read_text())


def load_engine(
    path: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any | None,
    rank: int,
    frozen_base: bool,
) -> dict[str, Any]:
    """Restore what ``save_engine`` wrote into a freshly built engine. Collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    path = Path(path)
    meta = read_meta(path)
    if meta["frozen_base"] != frozen_base:
        raise ValueError(
            f"{path}: checkpoint written {'with' if meta['frozen_base'] else 'without'} LoRA; "
            "build the engine with the same model.lora settings"
        )
    opts = _options(frozen_base)
    check_dcp_metadata(path / "state")  # torch unpickles it without limits
    if meta["optimizer"] and optimizer is not None:
        model_sd, optim_sd = get_state_dict(model, optimizer, options=opts)
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(path / "state"))
        set_state_dict(
            model,
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=opts,
        )
    else:
        state = {"model": get_model_state_dict(model, options=opts)}
        dcp.load(state, checkpoint_id=str(path / "state"))
        set_model_state_dict(model, state["model"], options=opts)
    own = path / f"rank{rank}.pt"
    extra = safe_torch_load(own if own.exists() else path / "rank0.pt")
    if scheduler is not None and extra["scheduler"] is not None:
        scheduler.load_state_dict(extra["scheduler"])
    set_rng_state(extra["rng"])
    dist.barrier()
    return meta
