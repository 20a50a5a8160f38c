"""Shared fixtures for the end-to-end tests: one built-in model cache per session,
so the supervised warm-up runs once however many CLI runs follow."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("model-cache")
