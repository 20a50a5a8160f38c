"""GDPO with a dict reward and no ``reward.weights``: every named reward weighs
1.0, as documented, and the run trains; a weight naming a reward the function
does not return stops the run when the first batch is scored, listing the names
it does return with the key syntax."""

from __future__ import annotations

import pytest
from cli_utils import COMMON, cli, metrics

from rlpost.models.tiny import build_tiny_model

pytest.importorskip("vllm")

REWARD = (
    "def score(completion, row):\n"
    "    return {'length': len(completion) / 8.0, 'short': float(len(completion) < 4)}\n"
)


def _gdpo(tmp_path, run_dir, *extra):
    model = build_tiny_model("micro", tmp_path / "m", seed=0, init_std=0.3)
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD)
    args = ["algo=gdpo", f"model.path={model}", *COMMON,
           "reward=custom", f"reward.fn={reward}:score", "trainer.total_steps=1",
           "trainer.val_every=0", f"trainer.run_dir={run_dir}", *extra]  # fmt: skip
    return cli(args)


def test_gdpo_weighs_every_named_reward_at_one_and_names_a_misspelled_weight(tmp_path):
    run_dir = tmp_path / "run"
    proc = _gdpo(tmp_path, run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (step,) = [r for r in metrics(run_dir) if r["step"] == 1]
    # total = 1.0 x length + 1.0 x short, the weights both default to
    total = step["reward/length/mean"] + step["reward/short/mean"]
    assert step["reward/mean"] == pytest.approx(total)
    assert step["actor/grad_norm"] > 0  # the normalised advantages moved the policy

    proc = _gdpo(tmp_path, tmp_path / "bad", "reward.weights.lenght=1.0")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "reward.weights name ['lenght'] but" in proc.stderr
    assert "returns ['length', 'short']" in proc.stderr
    assert "reward.weights.length=1.0" in proc.stderr
    assert "Traceback" not in proc.stderr
