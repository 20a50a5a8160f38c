"""Run checkpoints on the driver: atomic step directories, pruning, resume lookup,
and the driver's own state (step, data position, RNG, KL controller).

Layout under ``run_dir/checkpoints``::

    step_000010/          complete checkpoint of step 10
        policy/           FSDPEngine.save_checkpoint
        critic/           CriticEngine.save_checkpoint (PPO)
        driver.json       step, data stream, KL coefficient, anything JSON
        driver_rng.pt     python and torch RNG states of the driver
        COMPLETE          written last, inside the temporary directory
    step_000020.partial/  a save in progress (or killed): never reported

A step directory is built as ``step_N.partial`` and renamed into place once
everything (engines included) is written, so a kill at any point leaves the
previous checkpoint as the latest complete one.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

STEP_DIR = re.compile(r"^step_(\d+)$")
COMPLETE = "COMPLETE"
PARTIAL = ".partial"


class CheckpointManager:
    """Step directories of one run, the newest ``keep_last`` of them kept."""

    def __init__(self, run_dir: str | Path, keep_last: int):
        if keep_last < 1:
            raise ValueError(f"keep_last={keep_last}: keep at least one checkpoint")
        self.root = Path(run_dir) / "checkpoints"
        self.keep_last = keep_last

    def step_dir(self, step: int) -> Path:
        return self.root / f"step_{step:06d}"

    def atomic_write(self, step: int, writer: Callable[[Path], None]) -> Path:
        """Call ``writer(tmp_dir)`` to fill a temporary directory, then publish it as
        ``step_dir(step)`` and prune old checkpoints. If ``writer`` raises, the
        temporary directory is removed and nothing else changes.

        ``writer`` typically calls each engine's ``save_checkpoint(tmp_dir / name)``
        (which is itself atomic) and ``save_driver_state(tmp_dir, ...)``.
        """
        final = self.step_dir(step)
        tmp = final.with_name(final.name + PARTIAL)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            writer(tmp)
            (tmp / COMPLETE).write_text(str(step))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        old = final.with_name(final.name + ".old")
        if final.exists():  # re-saving a step: keep the old copy until the new is in place
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
        self.prune()
        return final

    def complete(self) -> list[tuple[int, Path]]:
        """(step, dir) of every complete checkpoint, oldest first."""
        if not self.root.is_dir():
            return []
        found = []
        for p in self.root.iterdir():
            m = STEP_DIR.match(p.name)
            if m and p.is_dir() and (p / COMPLETE).exists():
                found.append((int(m.group(1)), p))
        return sorted(found)

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None."""
        found = self.complete()
        return found[-1][1] if found else None

    def prune(self) -> None:
        """Delete all but the newest ``keep_last`` complete checkpoints, and leftovers
        of interrupted saves."""
        for _, path in self.complete()[: -self.keep_last]:
            shutil.rmtree(path)
        if self.root.is_dir():
            for p in self.root.iterdir():
                if p.name.endswith((PARTIAL, ".old")):
                    shutil.rmtree(p, ignore_errors=True)


def resolve_resume(resume: str, run_dir: str | Path, keep_last: int) -> Path | None:
    """``trainer.resume``: 'auto' -> latest complete checkpoint in the run dir (or None),
    'none' -> None, anything else -> that checkpoint directory (which must be complete)."""
    if resume == "none":
        return None
    if resume == "auto":
        return CheckpointManager(run_dir, keep_last).latest()
    path = Path(resume).expanduser()
    if not (path / COMPLETE).exists():
        raise FileNotFoundError(
            f"trainer.resume={resume!r}: not a complete checkpoint (no {COMPLETE} file); "
            "pass a run_dir/checkpoints/step_N directory, 'auto' or 'none'"
        )
    return path


def save_driver_state(directory: str | Path, state: dict[str, Any]) -> None:
    """Write the driver's JSON state (step, ``PromptStream.state_dict()``, KL
    coefficient, ...) and its python and torch RNG states."""
    d = Path(directory)
    (d / "driver.json").write_text(json.dumps(state, indent=1, sort_keys=True))
    torch.save({"python": random.getstate(), "torch": torch.get_rng_state()}, d / "driver_rng.pt")


def load_driver_state(directory: str | Path) -> dict[str, Any]:
    """Restore the driver's RNG states and return its JSON state."""
    d = Path(directory)
    rng = torch.load(d / "driver_rng.pt", weights_only=False)
    random.setstate(rng["python"])
    torch.set_rng_state(rng["torch"])
    return json.loads((d / "driver.json").read_text())
