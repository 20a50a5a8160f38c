"""The FSDP2 engine's preference update (``algo=dpo``) and the reward-model engine
(``algo=rm``), on the CPU and, under the ``gpu`` marker, on one CUDA GPU: hand-computed
first steps and a fixed batch learned.

Shapes: b = samples (pair p's chosen at row 2p, its rejected at 2p + 1), t = tokens.
"""

from __future__ import annotations

import math

import pytest
import torch
from engine_utils import DEVICES, engine, free_port, make_batch, on, spawn

from rlpost.algos import PreferenceConfig
from rlpost.models.tiny import build_tiny_model
from rlpost.trainers.batch import TrajectoryBatch
from rlpost.trainers.preference import REF_LOGPS

STEPS = 8


def _pairs() -> TrajectoryBatch:
    batch = make_batch(seed=3)  # eight ragged rows: four pairs
    batch.group_ids_b = torch.arange(4).repeat_interleave(2)
    batch.scores_b = {"margin": torch.zeros(8)}
    return batch


def _dpo_worker(rank: int, model_dir: str, port: int, out: str, device: str) -> None:
    e = engine(model_dir, rank, 1, port, device, lr=1e-2, micro_batch_size=4)
    batch = _pairs()
    # the reference is the starting policy: its sequence log-probs
    batch.scores_b[REF_LOGPS] = e.logprobs(batch).sum(-1)
    cfg = PreferenceConfig(loss="sigmoid", beta=0.5)
    metrics = [e.update_preference(batch, cfg) for _ in range(STEPS)]
    after = e.logprobs(batch).sum(-1)
    torch.save({"metrics": metrics, "ref": batch.scores_b[REF_LOGPS], "after": after}, out)
    e.close()


def _rm_worker(rank: int, model_dir: str, port: int, out: str, device: str) -> None:
    from rlpost.trainers.fsdp.engine import FSDPEngineConfig
    from rlpost.trainers.fsdp.reward_model import RewardModelEngine

    cfg = FSDPEngineConfig(
        model_path=model_dir, lr=1e-2, lr_warmup_steps=0, micro_batch_size=4, **on(device)
    )
    e = RewardModelEngine(cfg, rank, 1, f"tcp://127.0.0.1:{port}")
    batch = _pairs()
    before = e.rewards(batch)
    metrics = [e.update_reward_model(batch) for _ in range(STEPS)]
    torch.save({"before": before, "metrics": metrics, "after": e.rewards(batch)}, out)
    e.close()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(build_tiny_model("micro", tmp_path_factory.mktemp("pref") / "m", 0, init_std=0.3))


@pytest.mark.parametrize("device", DEVICES)
def test_dpo_starts_at_ln2_and_learns_the_pairs(device, model_dir, tmp_path):
    out = tmp_path / "dpo.pt"
    spawn(_dpo_worker, (model_dir, free_port(), str(out), device))
    got = torch.load(out, weights_only=False)
    first, last = got["metrics"][0], got["metrics"][-1]
    # policy = reference: every implicit reward beta * (logp - ref) is 0 (to the
    # rounding of two forward passes), so each pair's loss is -log sigmoid(0) = ln 2
    assert first["dpo/loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert first["rewards/margins"] == pytest.approx(0.0, abs=1e-5)
    # eight steps on the same four pairs: every pair won, the loss well below ln 2
    assert last["rewards/accuracies"] == 1.0
    assert last["dpo/loss"] < 0.5 * math.log(2)
    # won by the policy's own log-probs: chosen gained more over the reference than rejected
    gain = got["after"] - got["ref"]
    assert torch.all(gain[0::2] > gain[1::2])


@pytest.mark.parametrize("device", DEVICES)
def test_reward_model_first_loss_is_bradley_terry_of_its_scores(device, model_dir, tmp_path):
    out = tmp_path / "rm.pt"
    spawn(_rm_worker, (model_dir, free_port(), str(out), device))
    got = torch.load(out, weights_only=False)
    r = got["before"]
    # the first step's loss is mean_p -log sigmoid(r_chosen - r_rejected) of the scores
    # the engine gave before it, pair by pair
    expected = torch.nn.functional.softplus(-(r[0::2] - r[1::2])).mean()
    first, last = got["metrics"][0], got["metrics"][-1]
    assert first["rm/loss"] == pytest.approx(float(expected), rel=1e-5)
    assert first["rm/accuracy"] == pytest.approx(float((r[0::2] > r[1::2]).float().mean()))
    assert last["rm/accuracy"] == 1.0 and last["rm/loss"] < 0.5 * first["rm/loss"]
    after = got["after"]
    assert torch.all(after[0::2] > after[1::2])
