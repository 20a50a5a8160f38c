"""Writing a directory so that readers see either the old one or the complete new one,
and reading checkpoint files without running code from them."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def atomic_directory(out: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling of ``out`` to fill; on success it replaces ``out``.

    A crash or exception leaves ``out`` as it was and removes the temporary
    directory, so a half-written model is never found at ``out``.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; a model is not secret
        yield tmp
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class UnsafeCheckpointError(ValueError):
    """A checkpoint file holds more than tensors and plain values (pickled objects
    that could run code on load); it is refused."""


def safe_torch_load(path: str | Path) -> Any:
    """``torch.load`` restricted to tensors and plain containers (``weights_only``).

    A checkpoint from someone else must not run code when a run resumes from it;
    a file carrying pickled objects raises :class:`UnsafeCheckpointError` naming
    the file.
    """
    import pickle

    import torch

    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpointError(
            f"{path}: refused to load: the file holds pickled objects, not only tensors and "
            "plain values, and loading it could run code. rlpost's checkpoints never do; "
            f"do not resume from this checkpoint unless you know where it came from "
            f"({str(exc).splitlines()[0]})"
        ) from None
