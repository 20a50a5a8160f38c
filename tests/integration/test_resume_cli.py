"""Exact resume through the real CLI: 2k steps in one run equal k steps, a stop,
and k more steps resumed from the checkpoint (fixed seed)."""

from __future__ import annotations

import pytest
from cli_utils import comparable, run

from rlpost.models.tiny import build_tiny_model

pytest.importorskip("vllm")


def test_resumed_run_matches_uninterrupted_run(tmp_path):
    model = build_tiny_model("micro", tmp_path / "m", seed=0, init_std=0.3)
    straight = run(model, tmp_path / "a", 4)
    run(model, tmp_path / "b", 2)
    resumed = run(model, tmp_path / "b", 4)
    assert [r["step"] for r in resumed] == [0, 1, 2, 3, 4]
    assert sorted(p.name for p in (tmp_path / "b" / "checkpoints").iterdir()) == [
        "step_000002",
        "step_000004",
    ]
    for a, b in zip(straight, resumed):
        assert comparable(a) == comparable(b), a["step"]
    # The policy really moved between steps 2 and 4 (the comparison is not vacuous).
    assert max(r.get("actor/grad_norm", 0.0) for r in straight) > 0
