"""mypy over the packages as they install: ``rlpost`` with ``algos/``, ``rollout/``
``runtime/`` and ``trainers/`` inside it (setup.py), so that a call from one floor into
another is checked against the callee's signature.

mypy cannot follow the editable install's import hook: run on the repository's
folders, every ``rlpost.trainers`` (``rlpost.algos``, ``rlpost.rollout``) import
would be an unknown module and each name taken from it ``Any``. This builds the
installed layout as links in a scratch folder and checks that, with the
repository's settings (``[tool.mypy]`` in pyproject.toml) and cache.

    .venv/bin/python .ci/typecheck.py
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from mypy import api

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("algos", "rollout", "runtime", "trainers")


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="rlpost-typecheck-") as scratch:
        package = Path(scratch) / "rlpost"
        package.mkdir()
        for entry in (REPO / "rlpost").iterdir():
            if entry.name != "__pycache__":
                (package / entry.name).symlink_to(entry)
        for layer in LAYERS:
            (package / layer).symlink_to(REPO / layer)
        args = [
            "--config-file", str(REPO / "pyproject.toml"),
            "--cache-dir", str(REPO / ".mypy_cache"),
            "-p", "rlpost",
        ]  # fmt: skip
        os.chdir(scratch)
        out, err, status = api.run(args)
    sys.stdout.write(out.replace(f"{scratch}/", ""))
    sys.stderr.write(err)
    return status


if __name__ == "__main__":
    sys.exit(main())
