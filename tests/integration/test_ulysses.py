"""Ulysses sequence parallelism (``trainer.ulysses``): two ranks holding half of every
sequence give one rank's log-probs, loss, entropy, gradient norm and gradients, and
the critic's values and gradients.

Shapes: b = samples, t = tokens.

Each rank gets its share of the batch as the trainer group hands it out; the
sequence-parallel group joins the shares, so the two ranks train on all eight
samples together where one rank trains on them alone.
"""

from __future__ import annotations

import pytest
import torch
from engine_utils import advantages, engine, free_port, full_grads, make_batch, spawn

from rlpost.algos import PolicyLossConfig
from rlpost.models.tiny import build_tiny_model
from rlpost.trainers.fsdp.engine import RegularizerConfig
from rlpost.trainers.fsdp.lora import LoraSettings

# name -> (model shape, engine settings)
VARIANTS = {
    "padded": ("micro", dict(micro_batch_size=3)),  # 2 query heads, 1 key/value head
    "packed": ("micro", dict(micro_batch_size=3, packing=True)),
    "gqa_padded": ("tiny", dict(micro_batch_size=8)),  # 4 query heads, 2 key/value heads
    "lora_packed": ("micro", dict(micro_batch_size=8, packing=True, lora=LoraSettings(rank=4))),
}
REG = RegularizerConfig(entropy_coef=0.01)  # the entropies are gathered too


def _worker(rank: int, world: int, dirs: dict, port: int, out: str) -> None:
    results = {}
    for name, (shape, kw) in VARIANTS.items():
        eng = engine(dirs[shape], rank, world, port, lr=1e-4, ulysses=world, **kw)
        for n, p in eng.model.named_parameters():  # B = 0 would give lora_A no gradient
            if ".lora_B." in n:
                with torch.no_grad():
                    p.fill_(0.01)
        batch = make_batch()
        batch.advantages_bt = advantages(batch)
        mine = batch.shard(rank, world)
        mine.old_logp_bt = eng.logprobs(mine)
        metrics = eng.update_policy(mine, PolicyLossConfig(), reg=REG)
        results[name] = {"logp": mine.old_logp_bt, "grads": full_grads(eng.model), "m": metrics}
        del eng
    results["critic"] = _critic(rank, world, dirs["tiny"], port)
    torch.save(results, f"{out}.{rank}")


def _critic(rank: int, world: int, model_dir: str, port: int) -> dict:
    """Two value-regression steps (the zero-initialised head gives the body no
    gradient in the first): the values and gradients of the second."""
    from rlpost.trainers.fsdp.critic import CriticEngine
    from rlpost.trainers.fsdp.engine import FSDPEngineConfig

    cfg = FSDPEngineConfig(
        model_path=model_dir, lr=1e-2, lr_warmup_steps=0, micro_batch_size=3, ulysses=world
    )
    critic = CriticEngine(cfg, rank, world, f"tcp://127.0.0.1:{port}")
    batch = make_batch()
    batch.returns_bt = advantages(batch)
    mine = batch.shard(rank, world)
    for _ in range(2):
        mine.old_values_bt = critic.values(mine)
        metrics = critic.update_critic(mine, value_clip=10.0, agg="token-mean")
    return {"logp": mine.old_values_bt, "grads": full_grads(critic.model), "m": metrics}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[int, list[dict]]:
    """world size -> each rank's results."""
    root = tmp_path_factory.mktemp("ulysses")
    dirs = {s: str(build_tiny_model(s, root / s, 0, init_std=0.3)) for s in ("micro", "tiny")}
    out = {}
    for world in (1, 2):
        spawn(_worker, (world, dirs, free_port(), str(root / f"w{world}")), nprocs=world)
        out[world] = [torch.load(root / f"w{world}.{r}", weights_only=False) for r in range(world)]
    return out


@pytest.mark.parametrize("variant", [*VARIANTS, "critic"])
def test_two_sequence_parallel_ranks_match_one_rank(variant, runs):
    ref, parts = runs[1][0][variant], [r[variant] for r in runs[2]]
    mask = make_batch().response_mask_bt.bool()
    logp = torch.cat([p["logp"] for p in parts])  # each rank's own rows, in order
    torch.testing.assert_close(logp[mask], ref["logp"][mask], rtol=0, atol=1e-5)
    got = parts[0]
    assert got["grads"].keys() == ref["grads"].keys() and ref["grads"]
    worst = max((got["grads"][k] - g).abs().max().item() for k, g in ref["grads"].items())
    assert worst < 1e-5, worst
    role = "critic" if variant == "critic" else "actor"
    keys = (
        ("vf_loss", "grad_norm")
        if role == "critic"
        else ("loss", "pg_loss", "entropy", "grad_norm")
    )
    for key in (f"{role}/{k}" for k in keys):
        assert got["m"][key] == pytest.approx(ref["m"][key], rel=1e-5, abs=1e-7), key
        assert parts[1]["m"][key] == got["m"][key], key  # one global figure on every rank
    assert ref["m"][f"{role}/grad_norm"] > 1e-3  # not vacuous: a step of a real size
