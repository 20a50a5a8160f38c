"""Hardware markers: ``gpu`` tests are skipped where CUDA is absent, never faked;
the Ray that in-process CLI runs share ends with each test module."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="module", autouse=True)
def _shared_cli_ray():
    """Stops the Ray a module's in-process CLI runs shared (``tests/cli_in_process.py``),
    so that the next module finds none, as one starting its own Ray expects."""
    yield
    from tests.cli_in_process import stop_ray

    stop_ray()
