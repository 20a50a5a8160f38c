"""Engine checkpoints, written atomically: what every backend's checkpoint shares.

Layout of a checkpoint directory ``D``::

    D/engine.json     engine config, world size and the backend's own entries
    D/rank{r}.pt      rank r's RNG state and the backend's per-rank entries
    D/...             whatever else the backend writes (FSDP2: ``state/``, DCP files)

Every rank writes into ``D.partial``; after a barrier rank 0 renames it to
``D``, so ``D`` either exists complete or not at all (a shared filesystem is
assumed when ranks sit on several nodes).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist

from rlpost.runtime import device as devices
from rlpost.trainers.files import safe_torch_load

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

PARTIAL_SUFFIX = ".partial"


class CheckpointState(Protocol):
    """One engine rank's training state as a backend saves and restores it.

    What ``check`` and ``read`` get back -- ``meta`` (``engine.json``, parsed) and
    ``own`` (``rank{r}.pt``, unpickled) -- holds whatever the backend wrote, nested
    as it wrote it, so their values are untyped: each backend reads its own entries."""

    @property
    def config(self) -> DataclassInstance:
        """The engine config (a dataclass), recorded in ``engine.json``."""
        ...

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def write(self, tmp: Path) -> tuple[dict[str, object], dict[str, object]]:
        """Write the backend's shared files into ``tmp`` (collective); return this
        rank's entries for ``rank{r}.pt`` and the entries for ``engine.json``."""
        ...

    def check(self, path: Path, meta: dict[str, Any]) -> None:
        """Raise, saying what to change, if this engine cannot load ``path``."""
        ...

    def read(self, path: Path, meta: dict[str, Any], own: dict[str, Any]) -> None:
        """Restore the state from ``path``; ``own`` is this rank's ``rank{r}.pt``
        (rank 0's when the checkpoint had fewer ranks). Collective."""
        ...


rng_state = devices.rng_state
set_rng_state = devices.set_rng_state


def read_meta(path: str | Path) -> dict[str, Any]:
    meta_path = Path(path) / "engine.json"
    if not meta_path.exists():
        raise FileNotFoundError(f"{path}: not an engine checkpoint (no engine.json)")
    return json.loads(meta_path.read_text())


def save(path: str | Path, state: CheckpointState) -> str:
    """Write ``state`` to ``path``, atomically. Collective: every rank calls it."""
    final = Path(path)
    tmp = final.with_name(final.name + PARTIAL_SUFFIX)
    rank = state.rank
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    own, extra = state.write(tmp)
    torch.save({**own, "rng": rng_state()}, tmp / f"rank{rank}.pt")
    if rank == 0:
        meta = {
            "config": dataclasses.asdict(state.config),
            "world_size": state.world_size,
            **extra,
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
    return str(path)


def load(path: str | Path, state: CheckpointState) -> dict[str, Any]:
    """Restore what ``save`` wrote into a freshly built engine; returns ``engine.json``.
    Collective."""
    path = Path(path)
    meta = read_meta(path)
    state.check(path, meta)
    own_path = path / f"rank{state.rank}.pt"
    own = safe_torch_load(own_path if own_path.exists() else path / "rank0.pt")
    state.read(path, meta, own)
    set_rng_state(own["rng"])
    dist.barrier()
    return meta
