"""algo=dpo on the Megatron trainer: two preference steps at tensor parallel 2 (pairs
split over the ranks' shares, micro-batches of two pairs) equal the same steps on
one FSDP2 rank, loss for loss and weight for weight.

Shapes: b = samples (pair p's chosen at row 2p, its rejected at 2p + 1), t = tokens.
"""

from __future__ import annotations

import pytest
import torch
from engine_utils import engine, free_port, make_batch, spawn

from rlpost.algos import PreferenceConfig
from rlpost.models.tiny import build_tiny_model
from rlpost.trainers.preference import REF_LOGPS

pytest.importorskip("megatron.core")

LR = 1e-3
PREF = PreferenceConfig(loss="sigmoid", beta=0.5)


def pairs_batch():
    """Eight ragged rows as four pairs, with reference log-probs offset from zero so
    that the first step's implicit rewards already differ."""
    batch = make_batch(seed=3)
    batch.group_ids_b = torch.arange(4).repeat_interleave(2)
    batch.scores_b = {
        REF_LOGPS: torch.tensor([-30.0, -25.0, -20.0, -28.0, -35.0, -31.0, -22.0, -24.0]),
        "margin": torch.zeros(8),
    }
    return batch


def _fsdp(rank: int, model_dir: str, port: int, out: str) -> None:
    e = engine(model_dir, rank, 1, port, lr=LR, micro_batch_size=4)
    metrics = [e.update_preference(pairs_batch(), PREF) for _ in range(2)]
    torch.save({"metrics": metrics, "weights": dict(e.named_weights())}, out)
    e.close()


def _megatron(rank: int, model_dir: str, port: int, out: str) -> None:
    from rlpost.trainers.megatron.engine import (
        MegatronEngine,
        MegatronEngineConfig,
        MegatronParallel,
    )

    cfg = MegatronEngineConfig(
        model_path=model_dir, parallel=MegatronParallel(tp=2), lr=LR, lr_warmup_steps=0,
        micro_batch_size=4,
    )  # fmt: skip
    e = MegatronEngine(cfg, rank, 2, f"tcp://127.0.0.1:{port}")
    metrics = [e.update_preference(pairs_batch().shard(rank, 2), PREF) for _ in range(2)]
    weights = e.named_weights()
    if rank == 0:
        assert weights is not None
        torch.save({"metrics": metrics, "weights": dict(weights)}, out)
    e.close()


def test_dpo_steps_at_tensor_parallel_2_equal_the_fsdp_engine(tmp_path):
    model_dir = str(build_tiny_model("tiny", tmp_path / "m", seed=0))
    spawn(_fsdp, (model_dir, free_port(), str(tmp_path / "fsdp.pt")))
    spawn(_megatron, (model_dir, free_port(), str(tmp_path / "mg.pt")), nprocs=2)
    fsdp, mg = torch.load(tmp_path / "fsdp.pt"), torch.load(tmp_path / "mg.pt")
    for a, b in zip(fsdp["metrics"], mg["metrics"]):
        for key in ("dpo/loss", "rewards/margins", "rewards/accuracies", "logps/chosen"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), key
        assert b["dpo/grad_norm"] == pytest.approx(a["dpo/grad_norm"], rel=1e-4)
    # the second step starts from updated weights: the implicit rewards have moved
    assert fsdp["metrics"][1]["rewards/margins"] != fsdp["metrics"][0]["rewards/margins"]
    assert fsdp["weights"].keys() == mg["weights"].keys()
    # the same Adam steps: weights agree except where a gradient is float noise (Adam
    # moves every weight by about lr x its gradient's sign, whatever its size)
    for name, w in fsdp["weights"].items():
        diff = (mg["weights"][name] - w).abs()
        assert diff.max() <= 4 * LR + 1e-6, name
        assert (diff > 1e-5).float().mean() < 0.01, name
