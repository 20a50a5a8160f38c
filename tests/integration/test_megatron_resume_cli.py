"""Exact resume with trainer=megatron through the real CLI: 4 PPO steps in one run
equal the same run resumed from its checkpoint of step 2, as a run cut short after
that checkpoint leaves it (fixed seed). The
policy and the critic both run on Megatron, each with its Adam state sharded over 2
data-parallel ranks (the distributed optimizer); no KL penalty, so no reference
policy (2 x 2 trainer ranks on the test machine's 2 cores)."""

from __future__ import annotations

import shutil

import pytest
from cli_utils import comparable, run

from rlpost.models.tiny import build_tiny_model

pytest.importorskip("vllm")
pytest.importorskip("megatron.core")

ARGS = (
    "algo=ppo",
    "algo.kl.reward_coef=0",
    "trainer=megatron",
    "trainer.world_size=2",
    "trainer.megatron.distributed_optimizer=true",
)


# With -m extended: by default Megatron runs through the CLI once, at expert
# parallelism 2 (test_megatron_moe.py), and its checkpoints round-trip exactly on
# the engine (test_megatron_engine.py).
@pytest.mark.extended
def test_resumed_megatron_run_matches_uninterrupted_run(tmp_path):
    model = build_tiny_model("micro", tmp_path / "m", seed=0, init_std=0.3)
    straight = run(model, tmp_path / "a", 4, *ARGS)
    # What a run killed between its saves of steps 2 and 4 leaves: the checkpoint of
    # step 2, the rows and the timeline of steps past it, no final model.
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "checkpoints" / "step_000004")
    shutil.rmtree(tmp_path / "b" / "final")
    resumed = run(model, tmp_path / "b", 4, *ARGS)
    assert [r["step"] for r in resumed] == [0, 1, 2, 3, 4]
    assert sorted(p.name for p in (tmp_path / "b" / "checkpoints").iterdir()) == [
        "step_000002",
        "step_000004",
    ]
    for a, b in zip(straight, resumed):
        assert comparable(a) == comparable(b), a["step"]
    # The policy really moved between steps 2 and 4 (the comparison is not vacuous).
    assert all(r["actor/grad_norm"] > 0 and r["critic/grad_norm"] > 0 for r in straight[3:])
    # Still in the LR warm-up at step 3: the resumed engine's step count went on from
    # 2 (a fresh count would repeat step 1's rate, and the rows would differ).
    assert straight[3]["actor/lr"] > straight[2]["actor/lr"] > straight[1]["actor/lr"]
