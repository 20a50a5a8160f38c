"""Megatron engine on a Qwen3-MoE model (CPU, gloo): log-probs equal a transformers
forward and one update equals the FSDP2 engine's, without and with expert
parallelism (ep=2: each rank holds 2 of the 4 experts and tokens travel to their
experts by all-to-all).

Shapes: b = samples, t = tokens.

The model is ``rlpost.models.archs``' tiny random Qwen3-MoE (2 layers, 4 experts, top 2,
QK-norm, router weights renormalised over the top 2).
"""

import pytest
import torch
import torch.multiprocessing as mp
from engine_utils import (
    advantages,
    check_stream,
    free_port,
    hf_logprobs,
    make_batch,
    streamed_weights,
)

from rlpost.algos import PolicyLossConfig
from rlpost.models.archs import build_arch_model

LR = 1e-4
PRELOAD = [
    "torch.distributed.fsdp",
    "rlpost.trainers.fsdp.engine",
    "rlpost.trainers.megatron.engine",
]
# name: (world size, megatron settings)
LAYOUTS = {
    "ep1": (1, {}),
    "ep2": (2, {"ep": 2}),
    # tensor parallelism over the experts too; megatron-core asks for sequence parallelism
    "tp2_sp": (2, {"tp": 2, "sequence_parallel": True}),
}


def _spawn(fn, args: tuple, nprocs: int) -> None:
    mp.set_forkserver_preload(PRELOAD)
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")


def _batch():
    batch = make_batch(0)
    batch.advantages_bt = advantages(batch)
    return batch


def _megatron_worker(
    rank: int, world_size: int, model_dir: str, port: int, parallel: dict, out: str
) -> None:
    from rlpost.trainers.megatron.engine import (
        MegatronEngine,
        MegatronEngineConfig,
        MegatronParallel,
    )

    cfg = MegatronEngineConfig(
        model_path=model_dir,
        lr=LR,
        lr_warmup_steps=0,
        micro_batch_size=3,
        parallel=MegatronParallel(**parallel),
    )
    engine = MegatronEngine(cfg, rank, world_size, f"tcp://127.0.0.1:{port}")
    batch = _batch().shard(rank, world_size)
    logp = engine.logprobs(batch)
    batch.old_logp_bt = logp
    metrics = engine.update_policy(batch, PolicyLossConfig())
    weights = engine.named_weights()
    specs, streamed = streamed_weights(engine)  # the collective sync's source
    result = {"logp": logp, "metrics": metrics, "specs": specs, "streamed": streamed}
    if rank == 0:
        assert weights is not None
        result["weights"] = dict(weights)
    torch.save(result, f"{out}.{rank}")
    engine.close()


def _fsdp_worker(rank: int, model_dir: str, port: int, out: str) -> None:
    from engine_utils import engine as fsdp_engine

    engine = fsdp_engine(model_dir, rank, 1, port, lr=LR, micro_batch_size=8)
    batch = _batch()
    batch.old_logp_bt = engine.logprobs(batch)
    metrics = engine.update_policy(batch, PolicyLossConfig())
    torch.save({"metrics": metrics, "weights": dict(engine.named_weights())}, out)
    engine.close()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(build_arch_model("Qwen3MoeForCausalLM", tmp_path_factory.mktemp("moe") / "m"))


@pytest.fixture(scope="module")
def fsdp_step(model_dir, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("moe_fsdp") / "step.pt"
    _spawn(_fsdp_worker, (model_dir, free_port(), str(out)), 1)
    return torch.load(out)


@pytest.fixture(scope="module", params=list(LAYOUTS))
def megatron_step(request, model_dir, tmp_path_factory) -> dict:
    world_size, parallel = LAYOUTS[request.param]
    out = tmp_path_factory.mktemp(request.param) / "step.pt"
    args = (world_size, model_dir, free_port(), parallel, str(out))
    _spawn(_megatron_worker, args, world_size)
    ranks = [torch.load(f"{out}.{r}") for r in range(world_size)]
    result = ranks[0]
    result["logp"] = torch.cat([r["logp"] for r in ranks])  # each rank's own rows
    result["all_metrics"] = [r["metrics"] for r in ranks]
    result["others_streamed"] = [r["streamed"] for r in ranks[1:]]
    return result


def test_the_moe_weight_stream_is_named_weights_a_layer_at_a_time(megatron_step):
    """Each layer's experts gathered off every expert-parallel rank as its part
    comes, split per expert as ``named_weights`` splits them."""
    check_stream(megatron_step["specs"], megatron_step["streamed"], megatron_step["weights"])
    assert all(s == [] for s in megatron_step["others_streamed"])


def test_moe_logprobs_match_a_plain_transformers_forward(megatron_step, model_dir):
    from transformers import AutoModelForCausalLM

    batch = make_batch(0)
    ref_bt = hf_logprobs(AutoModelForCausalLM.from_pretrained(model_dir).eval(), batch)
    mask_bt = batch.response_mask_bt.bool()
    logp_bt = megatron_step["logp"]
    torch.testing.assert_close(logp_bt[mask_bt], ref_bt[mask_bt], rtol=0, atol=1e-4)
    assert torch.all(logp_bt[~mask_bt] == 0)
    assert logp_bt[mask_bt].std() > 0.05  # not a degenerate model


def test_moe_update_matches_the_fsdp_engine(megatron_step, fsdp_step):
    ref = fsdp_step["metrics"]
    for got in megatron_step["all_metrics"]:  # every rank reports the global metrics
        assert got["actor/loss"] == pytest.approx(ref["actor/loss"], abs=1e-4)
        assert got["actor/grad_norm"] == pytest.approx(ref["actor/grad_norm"], rel=1e-4)
        assert got["actor/entropy"] == pytest.approx(ref["actor/entropy"], rel=1e-4)
    # the exported weights (every expert, gathered off both expert-parallel ranks) are
    # the same Adam step: within 2 lr of the FSDP2 engine's, most of them far closer
    weights = megatron_step["weights"]
    assert weights.keys() == fsdp_step["weights"].keys()
    experts = [n for n in weights if ".mlp.experts." in n]
    assert len(experts) == 2 * 4 * 3  # layers x experts x (gate, up, down)
    for name, w in fsdp_step["weights"].items():
        diff = (weights[name] - w).abs()
        assert diff.max() <= 2 * LR + 1e-6, name
        assert (diff > 1e-6).float().mean() < 0.01, name


# The CLI at ep=2 with -m matrix; by default the engine tests above check the stream
# of every expert (a layer at a time, named as vLLM loads them) and
# test_weight_sync.py's moe case an MoE's experts synced into vLLM.
@pytest.mark.matrix
def test_cli_run_at_ep2_syncs_every_expert_to_vllm(model_dir, tmp_path):
    """The real CLI, 2 GRPO steps at ep=2 with the collective sync: the rollout
    samples from the trainer's weights after each sync (every expert gathered off
    both ranks a layer at a time, sent over the weight group) and the final model is
    the trained one."""
    pytest.importorskip("vllm")
    from cli_utils import run
    from transformers import AutoModelForCausalLM

    args = ("trainer=megatron", "trainer.megatron.ep=2", "trainer.world_size=2",
            "rollout.weight_sync=collective", "rollout.weight_sync_bucket_mb=0.05")  # fmt: skip
    rows = run(model_dir, tmp_path / "run", 2, *args)
    steps = [r for r in rows if r["step"] > 0]
    assert len(steps) == 2
    # several buckets per sync, each at most one part (a layer) beyond the bucket
    assert all(r["rollout/weight_sync/buckets"] > 1 for r in steps)
    assert all(r["rollout/logprob_abs_diff_max"] < 1e-3 for r in steps)
    assert all(r["actor/grad_norm"] > 0 for r in steps)
    final = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final").state_dict()
    start = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    assert final.keys() == start.keys()
    experts = [k for k in final if "experts" in k]
    assert experts and all(not torch.equal(final[k], start[k]) for k in experts)
