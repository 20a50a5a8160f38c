"""Resolve a user's ``'path/to/file.py:name'`` or ``'package.module:name'`` spec to an object.

Shared by tools, environments and tool-call parsers so that every plug-in point
reports a bad spec the same way: the message names the spec, what went wrong and
what to change.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import zlib
from pathlib import Path
from types import ModuleType

SPEC_FORMS = "'path/to/file.py:name' or 'package.module:name'"


def split_spec(spec: str) -> tuple[str, str] | None:
    """``(target, attribute)`` of a spec, or None when it is not of the two forms."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        return None
    return target, name


def load_object(spec: str, kind: str, error: type[Exception]) -> object:
    """The attribute a spec names; any failure raises ``error`` with a message that starts
    with ``"{kind} {spec!r}: "``. A file target is imported under a private module name,
    once per path (a second load reuses it)."""
    parts = split_spec(spec)
    if parts is None:
        raise error(f"{kind} {spec!r} is malformed; use {SPEC_FORMS}")
    target, name = parts
    if target.endswith(".py") or "/" in target:
        module = _load_file(spec, kind, Path(target), error)
    else:
        try:
            module = importlib.import_module(target)
        except Exception as e:  # add the spec to whatever the import raised
            raise error(
                f"{kind} {spec!r}: cannot import module {target!r} ({type(e).__name__}: {e}); "
                "check it is installed or on PYTHONPATH, or give a path to a .py file"
            ) from e
    if not hasattr(module, name):
        public = sorted(k for k in vars(module) if not k.startswith("_"))
        raise error(f"{kind} {spec!r}: {target!r} has no attribute {name!r}; it defines {public}")
    return getattr(module, name)


def _load_file(spec: str, kind: str, path: Path, error: type[Exception]) -> ModuleType:
    if not path.is_file():
        raise error(f"{kind} {spec!r}: file {str(path)!r} does not exist; fix the path")
    resolved = path.resolve()
    module_name = f"rlpost_user_{resolved.stem}_{zlib.crc32(str(resolved).encode()):08x}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    module_spec = importlib.util.spec_from_file_location(module_name, resolved)
    if module_spec is None or module_spec.loader is None:
        raise error(f"{kind} {spec!r}: {str(path)!r} cannot be imported as a Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:  # add the spec to whatever the user's file raised
        del sys.modules[module_name]
        raise error(
            f"{kind} {spec!r}: importing {str(path)!r} raised {type(e).__name__}: {e}"
        ) from e
    return module
