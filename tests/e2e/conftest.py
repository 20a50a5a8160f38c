"""Shared fixtures for the end-to-end tests: the built-in model cache and one GRPO
run of the built-in task that more than one test reads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> Path:
    """The cache the other tests' runs use as well (rlpost's default), so each
    built-in model's warm-up runs once in a test session however many runs
    follow; ``RLPOST_TEST_FRESH_CACHE=1`` gives the end-to-end runs an empty one."""
    if os.environ.get("RLPOST_TEST_FRESH_CACHE") == "1":
        return tmp_path_factory.mktemp("model-cache")
    from rlpost.config import compose
    from rlpost.models.warmup import cache_root

    return cache_root(compose([]))


GRPO_STEPS = 60


@pytest.fixture(scope="session")
def grpo_run(tmp_path_factory, model_cache) -> tuple[Path, list[dict]]:
    """``algo=grpo`` on the built-in task, seed 0, 60 steps validated every 30: its run
    directory and metric history. test_grpo_learns checks that it learned;
    test_opd_learns distils its final model into the base."""
    from tests.e2e.cli import run_cli

    run_dir = tmp_path_factory.mktemp("e2e") / "grpo"
    args = [
        "algo=grpo", f"trainer.total_steps={GRPO_STEPS}", "trainer.val_every=30",
        "trainer.seed=0",
    ]  # fmt: skip
    return run_dir, run_cli(args, run_dir, model_cache)
