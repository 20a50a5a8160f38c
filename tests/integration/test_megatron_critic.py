"""Megatron critic on CPU (gloo): three PPO critic updates equal the FSDP2 critic's on
the same batch (value loss, gradient norm, values after each update) at tensor
parallel 2, pipeline parallel 2 and data parallel 2 with the distributed optimizer,
and on one CUDA GPU (``gpu``-marked, one NCCL rank) against the CPU's FSDP2 critic.

Shapes: b = samples, t = tokens.

The value head starts at zero in both engines, so the first update moves only the
head (the body's gradient is the head's weight, 0); the second and third train the
body through it.
"""

import pytest
import torch
import torch.multiprocessing as mp
from engine_utils import free_port, make_batch, on, to_cpu

from rlpost.models.tiny import build_tiny_model

LR = 1e-3
STEPS = 3
CLIP = 0.2
PRELOAD = ["torch.distributed.fsdp", "rlpost.models.tiny", "rlpost.trainers.fsdp.critic"]
# name: (world size, megatron settings)
LAYOUTS = {
    "tp2": (2, {"tp": 2}),
    "pp2": (2, {"pp": 2}),
    "dp2_distopt": (2, {"distributed_optimizer": True}),
    "cp2": (2, {"cp": 2}),
    "tp2_sp": (2, {"tp": 2, "sequence_parallel": True}),
    "pp2_vpp2": (2, {"pp": 2, "vpp": 2}),
    "tp1_cuda": (1, {"device": "cuda"}),  # one rank on a CUDA GPU (bench/gpu_check.sh)
}
GPU_LAYOUTS = {"tp1_cuda"}


def _spawn(fn, args: tuple, nprocs: int) -> None:
    mp.set_forkserver_preload(PRELOAD)
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")


def _returns(batch) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return torch.randn(batch.input_ids_bt.shape, generator=g) * batch.response_mask_bt


def _batch(rank: int = 0, world_size: int = 1):
    """This rank's share of the batch, with returns drawn for the whole batch."""
    full = make_batch(0)
    full.returns_bt = _returns(full)
    return full.shard(rank, world_size)


def _updates(critic, batch) -> dict:
    """``STEPS`` rounds of: values -> old values, one critic update; metrics and values."""
    metrics, values = [], []
    for _ in range(STEPS):
        batch.old_values_bt = critic.values(batch)
        values.append(batch.old_values_bt)
        metrics.append(critic.update_critic(batch, value_clip=CLIP, agg="token-mean"))
    values.append(critic.values(batch))
    return {"metrics": metrics, "values": values, "num_params": critic.num_params}


def _fsdp_worker(rank: int, model_dir: str, port: int, out: str) -> None:
    from rlpost.trainers.fsdp.critic import CriticEngine
    from rlpost.trainers.fsdp.engine import FSDPEngineConfig

    cfg = FSDPEngineConfig(model_path=model_dir, lr=LR, lr_warmup_steps=0, micro_batch_size=8)
    critic = CriticEngine(cfg, 0, 1, f"tcp://127.0.0.1:{port}")
    torch.save(_updates(critic, _batch()), out)
    critic.close()


def _megatron_worker(
    rank: int, world_size: int, model_dir: str, port: int, parallel: dict, out: str
) -> None:
    from rlpost.trainers.megatron.config import MegatronEngineConfig, MegatronParallel
    from rlpost.trainers.megatron.critic import MegatronCriticEngine

    parallel = dict(parallel)
    device = parallel.pop("device", "cpu")  # an engine setting, not a split
    cfg = MegatronEngineConfig(
        model_path=model_dir,
        lr=LR,
        lr_warmup_steps=0,
        micro_batch_size=3,
        parallel=MegatronParallel(**parallel),
        **on(device),
    )
    critic = MegatronCriticEngine(cfg, rank, world_size, f"tcp://127.0.0.1:{port}")
    torch.save(to_cpu(_updates(critic, _batch(rank, world_size))), f"{out}.{rank}")
    critic.close()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(build_tiny_model("tiny", tmp_path_factory.mktemp("mgc") / "m", seed=0))


@pytest.fixture(scope="module")
def fsdp_run(model_dir, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("fsdp_critic") / "run.pt"
    _spawn(_fsdp_worker, (model_dir, free_port(), str(out)), 1)
    return torch.load(out)


@pytest.mark.parametrize(
    "layout",
    [pytest.param(n, marks=pytest.mark.gpu) if n in GPU_LAYOUTS else n for n in LAYOUTS],
)
def test_critic_updates_match_the_fsdp_critic(layout, model_dir, fsdp_run, tmp_path):
    world_size, parallel = LAYOUTS[layout]
    out = tmp_path / "run.pt"
    _spawn(_megatron_worker, (world_size, model_dir, free_port(), parallel, str(out)), world_size)
    ranks = [torch.load(f"{out}.{r}") for r in range(world_size)]
    batch = make_batch(0)
    mask_bt = batch.response_mask_bt.bool()

    # Before any update the zero head gives V = 0, so the clipped term equals the plain
    # one and the token-mean loss is 0.5 * mean of R^2 over the response tokens.
    returns_bt = _returns(batch)
    first = 0.5 * returns_bt[mask_bt].square().mean().item()
    assert fsdp_run["metrics"][0]["critic/vf_loss"] == pytest.approx(first, rel=1e-6)

    global_keys = ("critic/loss", "critic/vf_loss", "critic/vf_clipfrac", "critic/lr")
    for step, ref in enumerate(fsdp_run["metrics"]):
        for rank in ranks:  # every rank reports the same global metrics
            got = rank["metrics"][step]
            assert got.keys() == ref.keys()
            for key in global_keys:
                assert got[key] == pytest.approx(ref[key], abs=1e-4), (step, key)
            assert got["critic/grad_norm"] == pytest.approx(ref["critic/grad_norm"], rel=1e-4)
            assert got["critic/skipped_updates"] == 0.0
    # the values before each update and after the last, each rank's own rows
    for step, ref_bt in enumerate(fsdp_run["values"]):
        got_bt = torch.cat([r["values"][step] for r in ranks])
        torch.testing.assert_close(got_bt, ref_bt, rtol=0, atol=1e-4, msg=f"values {step}")
        assert torch.all(got_bt[~mask_bt] == 0)
    # not vacuous: the critic learned (the values moved, the loss fell), and the body
    # trained too (after the first update the gradient norm includes its share)
    assert fsdp_run["values"][-1][mask_bt].abs().max() > 0.05
    losses = [m["critic/vf_loss"] for m in fsdp_run["metrics"]]
    assert losses[-1] < losses[0]
    assert ranks[0]["num_params"] == fsdp_run["num_params"]
