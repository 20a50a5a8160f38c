"""Writing a directory so that readers see either the old one or the complete new one."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


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
