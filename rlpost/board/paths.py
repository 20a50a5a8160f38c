"""Resolving a user-given path inside the runs root, and nowhere else."""

from __future__ import annotations

from pathlib import Path, PurePosixPath


class Forbidden(ValueError):
    """A path that leads out of the runs root (``..``, absolute, or a symlink out)."""


def under_root(root: Path, rel: str) -> Path:
    """``root / rel`` resolved, or ``Forbidden`` when it is not inside ``root``.

    ``rel`` is a path relative to ``root`` with ``/`` separators; absolute paths,
    ``..`` parts, backslashes and NUL are refused before anything is resolved,
    and the resolved path (symlinks followed) must still lie under the resolved
    root, so a link inside the root that points out of it is refused too.
    """
    if "\\" in rel or "\x00" in rel:
        raise Forbidden(f"{rel!r}: not a relative path")
    pure = PurePosixPath(rel)
    if pure.is_absolute() or rel.startswith("~") or ".." in pure.parts:
        raise Forbidden(f"{rel!r}: outside the runs root")
    base = root.resolve()
    target = (base / pure).resolve()
    if target != base and base not in target.parents:
        raise Forbidden(f"{rel!r}: outside the runs root")
    return target


def relative(root: Path, path: Path) -> str:
    """``path`` as the ``/``-separated name the pages use for it ("" for the root)."""
    rel = path.resolve().relative_to(root.resolve())
    return "" if rel == Path(".") else rel.as_posix()
