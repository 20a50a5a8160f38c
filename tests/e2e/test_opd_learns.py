"""algo=opd distils a GRPO-trained teacher into the warmed-up base (real CLI, seed 0):
the student's reverse KL to the teacher falls and its held-out accuracy rises
towards the teacher's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.cli import run_cli

pytest.importorskip("vllm")

TEACHER_STEPS = 20
STEPS = 20


@pytest.fixture(scope="module")
def teacher(tmp_path_factory, model_cache) -> tuple[Path, float]:
    """The built-in model after a short GRPO run: its final model and its accuracy."""
    run_dir = tmp_path_factory.mktemp("opd") / "teacher"
    args = ["algo=grpo", f"trainer.total_steps={TEACHER_STEPS}", "trainer.val_every=0"]
    history = run_cli(args, run_dir, model_cache)
    return run_dir / "final", [h["val/accuracy"] for h in history if "val/accuracy" in h][-1]


def test_opd_closes_the_gap_to_the_teacher(tmp_path, model_cache, teacher):
    teacher_path, teacher_acc = teacher
    args = [
        "algo=opd", f"teacher.path={teacher_path}", f"trainer.total_steps={STEPS}",
        "trainer.val_every=10", "trainer.save_every=0",
    ]  # fmt: skip
    history = run_cli(args, tmp_path / "opd", model_cache)
    val = [h["val/accuracy"] for h in history if "val/accuracy" in h]
    steps = [h for h in history if h["step"] > 0]
    assert len(steps) == STEPS and len(val) == 3
    # Seed 0 from the shipped base: the teacher reaches 0.555 after 20 GRPO steps
    # from 0.390 (0.61 from the 0.33 base of before).
    assert teacher_acc - val[0] >= 0.15, (teacher_acc, val)
    # The student learns the teacher's answers: at its best held-out check at least
    # half the gap is closed (measured: 0.390 -> 0.500 at step 10 -> 0.430 at 20;
    # held-out accuracy moves by several points between checks, docs/distillation.md).
    assert max(val[1:]) - val[0] >= 0.5 * (teacher_acc - val[0]), (teacher_acc, val)
    # The reverse KL (nats per sampled token) falls as the student nears the teacher.
    kl = [h["opd/reverse_kl"] for h in steps]
    assert kl[0] > 0 and sum(kl[-5:]) / 5 < 0.5 * sum(kl[:5]) / 5, kl
    # the student's log-probs are the policy's: the rollout sampled from the trainer's weights
    assert max(h["rollout/logprob_abs_diff_max"] for h in steps) < 1e-3
    assert all("timing/teacher_logprob_s" in h for h in steps)
