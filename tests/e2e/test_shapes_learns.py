"""The real CLI trains a vision-language model with GRPO on the built-in shapes
task (a picture's colour): the warm-up teaches only the answer's form, so the
built-in tiny_vl starts at chance, and RL teaches it to read the picture."""

from __future__ import annotations

import pytest

from tests.e2e.cli import run_cli

pytest.importorskip("vllm")

STEPS = 60


# One of the learning runs with -m presets (2.5 min): a vision-language GRPO run's
# mechanics are checked by default in tests/integration/test_vl_cli.py.
@pytest.mark.slow
@pytest.mark.presets
def test_colour_accuracy_rises(tmp_path, model_cache):
    args = ["data=shapes", f"trainer.total_steps={STEPS}", "trainer.val_every=0", "trainer.seed=0"]
    history = run_cli(args, tmp_path / "run", model_cache)
    val = [(h["step"], h["val/accuracy"]) for h in history if "val/accuracy" in h]
    assert [s for s, _ in val] == [0, STEPS]
    start, end = val[0][1], val[-1][1]
    # Seed 0: chance is 1/4 (0.245 held out); 60 steps of GRPO reach about 0.74.
    assert start <= 0.35, val
    assert end - start >= 0.2, val
    steps = [h for h in history if h["step"] > 0]
    # the rollout samples from the trained policy, images and all
    assert max(h["rollout/logprob_abs_diff_max"] for h in steps) < 1e-3
