"""FSDP2 engine checkpoints: sharded model and optimizer (torch.distributed.checkpoint)
and the LR schedule, inside the layout of ``rlpost.trainers.checkpointing``::

    D/engine.json      engine config, world size, which parts are present
    D/state/           DCP files: {"model": ..., "optim": ...}, one shard per rank
    D/rank{r}.pt       LR scheduler and RNG states of rank r

DCP reshards on load, so a checkpoint written by N ranks loads into M; RNG
states then come from rank 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rlpost.trainers.checkpointing import read_meta as read_meta  # re-exported: rlpost.export
from rlpost.trainers.engine_config import EngineConfig
from rlpost.trainers.files import check_dcp_metadata


def _options(frozen_base: bool):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # With LoRA the base weights never change: they come from the model path,
    # and only the adapter (the trainable parameters) is saved.
    return StateDictOptions(ignore_frozen_params=frozen_base, strict=not frozen_base)


class FSDPState:
    """An FSDP2 engine's model, optimizer and LR schedule, as a ``CheckpointState``.

    ``frozen_base`` (LoRA): only the trainable parameters are saved and loaded.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None,
        config: EngineConfig,
        rank: int,
        world_size: int,
        frozen_base: bool,
    ):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.config, self.rank, self.world_size = config, rank, world_size
        self.frozen_base = frozen_base

    def write(self, tmp: Path) -> tuple[dict[str, object], dict[str, object]]:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        # An optimizer that never stepped has no state; DCP would create it with a
        # zero-lr step (which advances Adam's step count), so it is left out.
        with_optim = self.optimizer is not None and bool(self.optimizer.state)
        opts = _options(self.frozen_base)
        if with_optim:
            assert self.optimizer is not None
            model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=opts)
            state: dict[str, object] = {"model": model_sd, "optim": optim_sd}
        else:
            state = {"model": get_model_state_dict(self.model, options=opts)}
        dcp.save(state, checkpoint_id=str(tmp / "state"))
        own: dict[str, object] = {
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None
        }
        return own, {"optimizer": with_optim, "frozen_base": self.frozen_base}

    def check(self, path: Path, meta: dict[str, Any]) -> None:
        if meta["frozen_base"] != self.frozen_base:
            raise ValueError(
                f"{path}: checkpoint written {'with' if meta['frozen_base'] else 'without'} "
                "LoRA; build the engine with the same model.lora settings"
            )

    def read(self, path: Path, meta: dict[str, Any], own: dict[str, Any]) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_state_dict,
            set_model_state_dict,
            set_state_dict,
        )

        model, optimizer = self.model, self.optimizer
        opts = _options(self.frozen_base)
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
        if self.scheduler is not None and own["scheduler"] is not None:
            self.scheduler.load_state_dict(own["scheduler"])
