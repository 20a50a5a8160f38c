"""Fixtures shared by the integration tests' CLI runs on the micro model."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def micro_model(tmp_path_factory):
    """The micro model the CLI tests train (seed 0, weights wide enough to move)."""
    from rlpost.models.tiny import build_tiny_model

    return build_tiny_model("micro", tmp_path_factory.mktemp("micro"), seed=0, init_std=0.3)


@pytest.fixture(scope="session")
def straight_dir(micro_model, tmp_path_factory):
    """The run directory of four sync steps of ``micro_model`` through the CLI,
    weights through the object store (``cli_utils.run``'s settings): the run a
    resumed run, fully_async with ``async.max_staleness=0`` and the collective and
    ipc syncs each reproduce, and whose timeline the trace tests read."""
    from cli_utils import run

    run_dir = tmp_path_factory.mktemp("straight") / "run"
    run(micro_model, run_dir, 4)
    return run_dir


@pytest.fixture(scope="session")
def straight_run(straight_dir) -> list[dict]:
    """The metrics rows of ``straight_dir``'s run."""
    from cli_utils import metrics

    return metrics(straight_dir)
