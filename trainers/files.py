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
    """``torch.load`` restricted to tensors and plain containers (``weights_only``):
    whatever the file holds, nested as it was saved (so the result is untyped).

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


# What a torch.distributed.checkpoint ``.metadata`` pickle may name: its own
# dataclasses, tensor sizes, dtypes and layouts, and paths.
_DCP_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
_DCP_NAMES = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
}


def check_dcp_metadata(state_dir: str | Path) -> None:
    """Unpickle a distributed checkpoint's ``.metadata`` with only the classes such a
    file holds allowed (torch's loader unpickles it without limits); anything else
    raises :class:`UnsafeCheckpointError` before torch reads the file."""
    import pickle

    import torch

    path = Path(state_dir) / ".metadata"

    class Restricted(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> object:
            allowed = (
                module in _DCP_MODULES
                or (module, name) in _DCP_NAMES
                or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))
            )
            if not allowed:
                raise UnsafeCheckpointError(
                    f"{path}: refused to load: it names {module}.{name}, which a checkpoint's "
                    "metadata never holds, and loading it could run code; do not resume from "
                    "this checkpoint unless you know where it came from"
                )
            return super().find_class(module, name)

    with open(path, "rb") as f:
        Restricted(f).load()
