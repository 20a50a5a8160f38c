"""Shared fixtures for the end-to-end tests: the built-in model cache."""

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
