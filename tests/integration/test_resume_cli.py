"""Exact resume through the real CLI: 2k steps in one run equal k steps, a stop,
and k more steps resumed from the checkpoint (fixed seed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rlpost.tiny import build_tiny_model

pytest.importorskip("vllm")

COMMON = [
    "trainer.save_every=2", "trainer.val_every=2", "data.prompts_per_step=4", "rollout.n=4",
    "data.val_size=16", "rollout.kv_cache_gib=0.0625", "trainer.lr=1e-3",
]  # fmt: skip


# Completions of the random model differ in length: a reward with a signal in every group.
REWARD = "def score(completion, row):\n    return len(completion) / 8.0\n"


def _run(model, run_dir, steps):
    reward = run_dir.parent / "reward.py"
    reward.write_text(REWARD)
    cmd = [sys.executable, "-m", "rlpost.main", f"model.path={model}", *COMMON,
           "reward=custom", f"reward.fn={reward}:score",
           f"trainer.total_steps={steps}", f"trainer.run_dir={run_dir}"]  # fmt: skip
    env = {**os.environ, "TQDM_DISABLE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _comparable(row):
    # Timings differ run to run; the request counter counts since the replica started.
    return {
        k: v for k, v in row.items()
        if not k.startswith(("timing/", "perf/")) and not k.endswith("/requests")
    }  # fmt: skip


def test_resumed_run_matches_uninterrupted_run(tmp_path):
    model = build_tiny_model("micro", tmp_path / "m", seed=0, init_std=0.3)
    straight = _run(model, tmp_path / "a", 4)
    _run(model, tmp_path / "b", 2)
    resumed = _run(model, tmp_path / "b", 4)
    assert [r["step"] for r in resumed] == [0, 1, 2, 3, 4]
    assert sorted(p.name for p in (tmp_path / "b" / "checkpoints").iterdir()) == [
        "step_000002",
        "step_000004",
    ]
    for a, b in zip(straight, resumed):
        assert _comparable(a) == _comparable(b), a["step"]
    # The policy really moved between steps 2 and 4 (the comparison is not vacuous).
    assert max(r.get("actor/grad_norm", 0.0) for r in straight) > 0
