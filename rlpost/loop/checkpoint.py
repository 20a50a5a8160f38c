"""Run checkpoints on the driver: atomic step directories, pruning, resume lookup,
and the driver's own state (step, data position, RNG, KL controller).

Layout under ``run_dir/checkpoints``::

    step_000010/          complete checkpoint of step 10
        policy/           FSDPEngine.save_checkpoint
        critic/           CriticEngine.save_checkpoint (PPO)
        driver.json       step, data stream, KL coefficient, python RNG, anything JSON
        driver_rng.pt     torch RNG state of the driver (a tensor)
        MANIFEST.json     size and CRC-32 of every file above
        COMPLETE          written last, inside the temporary directory
    step_000020.partial/  a save in progress (or killed): never reported

A step directory is built as ``step_N.partial`` and renamed into place once
everything (engines included) is written, so a kill at any point leaves the
previous checkpoint as the latest complete one. A checkpoint damaged after it
was written (a truncated or altered file) fails its manifest check, and
``pick_checkpoint`` falls back to the one before it with a warning. Nothing in
a checkpoint is unpickled: files load as tensors and plain values only
(``weights_only``), so a checkpoint from someone else cannot run code.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import re
import shutil
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import torch

from rlpost.trainers.files import safe_torch_load

if TYPE_CHECKING:
    from rlpost.loop.source import InFlight

log = logging.getLogger(__name__)


class DriverState(TypedDict, total=False):
    """``driver.json`` as ``load_driver_state`` returns it (``Recovery.save_checkpoint``
    writes it): the step, ``PromptStream.state_dict()``, the KL coefficient and the
    rollout source's generation in flight, if any."""

    step: int
    stream: dict
    kl_coef: float
    in_flight: InFlight


STEP_DIR = re.compile(r"^step_(\d+)$")
COMPLETE = "COMPLETE"
MANIFEST = "MANIFEST.json"
PARTIAL = ".partial"
DISK_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or none can be resumed; the message says what to do."""


class CheckpointManager:
    """Step directories of one run, the newest ``keep_last`` of them kept."""

    def __init__(self, run_dir: str | Path, keep_last: int):
        if keep_last < 1:
            raise ValueError(f"keep_last={keep_last}: keep at least one checkpoint")
        self.root = Path(run_dir) / "checkpoints"
        self.keep_last = keep_last

    def step_dir(self, step: int) -> Path:
        return self.root / f"step_{step:06d}"

    def atomic_write(
        self,
        step: int,
        writer: Callable[[Path], None],
        passthrough: tuple[type[BaseException], ...] = (),
    ) -> Path:
        """Call ``writer(tmp_dir)`` to fill a temporary directory, then publish it as
        ``step_dir(step)`` and prune old checkpoints. If ``writer`` raises, the
        temporary directory is removed and nothing else changes: an exception of a
        ``passthrough`` type (a worker that died while saving, which the caller
        recovers from) is re-raised as it is, any other becomes a ``CheckpointError``.

        ``writer`` typically calls each engine's ``save_checkpoint(tmp_dir / name)``
        (which is itself atomic) and ``save_driver_state(tmp_dir, ...)``.
        """
        final = self.step_dir(step)
        tmp = final.with_name(final.name + PARTIAL)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            writer(tmp)
            (tmp / MANIFEST).write_text(json.dumps(_manifest(tmp), indent=1, sort_keys=True))
            (tmp / COMPLETE).write_text(str(step))
        except BaseException as exc:
            reason = _write_failure(exc, self.root)  # before the cleanup frees space
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(exc, (KeyboardInterrupt, SystemExit, *passthrough)):
                raise
            # (torch's CheckpointException derives from BaseException, hence not Exception)
            previous = self.latest()
            raise CheckpointError(
                f"checkpoint of step {step} could not be written to {self.root}: "
                f"{reason}. The previous checkpoint "
                f"({previous.name if previous else 'none'}) is intact. Free space on that "
                "filesystem, lower trainer.keep_last or trainer.save_every, or set "
                "trainer.run_dir to a larger disk, then resume with the same command."
            ) from exc
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


def pick_checkpoint(resume: str, run_dir: str | Path, keep_last: int) -> Path | None:
    """The checkpoint ``trainer.resume`` names, checked against its manifest.

    With 'auto' a damaged newest checkpoint is skipped with a warning for the one
    before it; when every one is damaged, or an explicit path is, that is a
    :class:`CheckpointError` (starting afresh would silently drop the run's steps).
    """
    if resume == "none":
        return None
    if resume != "auto":
        path = resolve_resume(resume, run_dir, keep_last)
        assert path is not None
        problem = verify(path)
        if problem:
            raise CheckpointError(f"trainer.resume={resume}: the checkpoint is damaged: {problem}")
        return path
    found = CheckpointManager(run_dir, keep_last).complete()
    damaged: list[str] = []
    for _, path in reversed(found):
        problem = verify(path)
        if problem is None:
            if damaged:
                log.warning("resuming from %s instead", path.name)
            return path
        log.warning(
            "checkpoint %s is damaged (%s); falling back to the one before it", path, problem
        )
        damaged.append(f"{path.name}: {problem}")
    if damaged:
        raise CheckpointError(
            "every checkpoint in the run directory is damaged: "
            + "; ".join(damaged)
            + ". Set trainer.resume=none to start afresh (the run's metrics are then rewritten)."
        )
    return None


def verify(path: str | Path) -> str | None:
    """What is wrong with the checkpoint at ``path`` by its manifest, or None.

    A checkpoint written before manifests existed has nothing to check against
    and passes.
    """
    path = Path(path)
    manifest = path / MANIFEST
    if not manifest.exists():
        return None
    try:
        expected = json.loads(manifest.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return f"{MANIFEST} unreadable ({exc})"
    actual = _manifest(path)
    for name, (size, crc) in sorted(expected.items()):
        if name not in actual:
            return f"{name} is missing"
        if actual[name][0] != size:
            return f"{name} has {actual[name][0]} bytes, {size} were written"
        if actual[name][1] != crc:
            return f"{name} changed since it was written (checksum mismatch)"
    return None


def _manifest(root: Path) -> dict[str, tuple[int, int]]:
    """Relative path -> (size, CRC-32) of every file under ``root`` but the markers."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name not in (MANIFEST, COMPLETE):
            crc = 0
            with open(p, "rb") as f:
                while chunk := f.read(1 << 22):
                    crc = zlib.crc32(chunk, crc)
            out[str(p.relative_to(root))] = (p.stat().st_size, crc)
    return out


def _write_failure(exc: BaseException, root: Path) -> str:
    """Why a save failed, in one line: the out-of-space error behind ``exc`` (raised
    here or in a worker, where torch's distributed checkpoint and Ray wrap it and
    only its text survives; torch reports a short write as a RuntimeError), with
    the space left, or else the last line of the error itself."""
    free = shutil.disk_usage(root).free if root.exists() else -1
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in DISK_ERRNOS:
            return f"{os.strerror(seen.errno or 0)} ({free} bytes free)"
        seen = getattr(seen, "cause", None) or seen.__cause__ or seen.__context__
    text = str(exc)
    errnos = [int(n) for n in re.findall(r"\[Errno (\d+)\]", text)]
    for n in errnos:
        if n in DISK_ERRNOS:
            return f"{os.strerror(n)} ({free} bytes free)"
    last = next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")
    if 0 <= free < (1 << 20) or "unexpected pos" in text:
        return f"the disk is full or a file-size limit was hit ({free} bytes free; {last})"
    return f"{type(exc).__name__}: {last}"


def save_driver_state(directory: str | Path, state: Mapping[str, object]) -> None:
    """Write the driver's JSON state (step, ``PromptStream.state_dict()``, KL
    coefficient, ...) with its python RNG state, and its torch RNG state (a tensor)."""
    d = Path(directory)
    version, internal, gauss = random.getstate()
    state = {**state, "python_rng": [version, list(internal), gauss]}
    (d / "driver.json").write_text(json.dumps(state, indent=1, sort_keys=True))
    torch.save({"torch": torch.get_rng_state()}, d / "driver_rng.pt")


def load_driver_state(directory: str | Path) -> DriverState:
    """Restore the driver's RNG states and return its JSON state."""
    d = Path(directory)
    state = json.loads((d / "driver.json").read_text())
    version, internal, gauss = state.pop("python_rng")
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(safe_torch_load(d / "driver_rng.pt")["torch"])
    return state
