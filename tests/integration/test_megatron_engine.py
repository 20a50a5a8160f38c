"""Megatron engine on CPU (gloo): log-prob parity with transformers and one update's
parity with the FSDP2 engine, at tensor parallel 2, pipeline parallel 2 and with the
distributed optimizer; SFT and HF export at tensor parallel 2. One layout also runs on
a CUDA GPU (``gpu``-marked, one NCCL rank): the same parity, against the CPU's FSDP2
engine and transformers.

Shapes: b = samples, t = tokens.

Every engine runs in fresh processes (one default process group each) and hands its
results back through files. The model is the built-in ``tiny`` preset (4 heads, 2
key/value heads, 4 layers), which splits over 2 tensor-parallel ranks and 2 stages.
"""

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from engine_utils import (
    advantages,
    check_stream,
    free_port,
    full_grads,
    greedy_batch,
    hf_logprobs,
    make_batch,
    on,
    streamed_weights,
    to_cpu,
)

from rlpost.algos import PolicyLossConfig
from rlpost.models.tiny import build_tiny_model

LR = 1e-4
PRELOAD = [
    "torch.distributed.fsdp",
    "rlpost.models.tiny",
    "rlpost.trainers.fsdp.engine",
    "rlpost.trainers.megatron.engine",
]
# name: (world size, megatron settings (and packing), single-pass update)
LAYOUTS = {
    "tp1": (1, {}, False),
    "tp2": (2, {"tp": 2}, False),
    "pp2": (2, {"pp": 2}, False),
    "dp2_distopt": (2, {"distributed_optimizer": True}, False),
    "tp2_recompute": (2, {"tp": 2, "recompute": "full"}, False),
    # the update's own log-probs as the old ones, recorded on the last stage
    "pp2_single_pass": (2, {"pp": 2}, True),
    # the sequence split over 2 ranks (trainers/megatron/context_parallel.py)
    "cp2": (2, {"cp": 2}, False),
    "cp2_packed": (2, {"cp": 2, "packing": True}, False),
    # activations between the tp blocks split over the tp ranks (sequence_parallel.py)
    "tp2_sp": (2, {"tp": 2, "sequence_parallel": True}, False),
    # two virtual stages per rank: layers 0, 2 on rank 0 and 1, 3 on rank 1 (interleaved 1F1B)
    "pp2_vpp2": (2, {"pp": 2, "vpp": 2}, False),
    # one rank on a CUDA GPU, NCCL (run by bench/gpu_check.sh)
    "tp1_cuda": (1, {"device": "cuda"}, False),
}
GPU_LAYOUTS = {"tp1_cuda"}


def _spawn(fn, args: tuple, nprocs: int) -> None:
    mp.set_forkserver_preload(PRELOAD)
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")


def _megatron(model_dir: str, rank: int, world_size: int, port: int, parallel: dict, **kw):
    from rlpost.trainers.megatron.engine import (
        MegatronEngine,
        MegatronEngineConfig,
        MegatronParallel,
    )

    kw.setdefault("lr", LR)
    kw.setdefault("lr_warmup_steps", 0)
    cfg = MegatronEngineConfig(model_path=model_dir, parallel=MegatronParallel(**parallel), **kw)
    return MegatronEngine(cfg, rank, world_size, f"tcp://127.0.0.1:{port}")


# -- workers (module level so that the child processes can import them) --------
def _step_worker(
    rank: int, world_size: int, model_dir: str, port: int, parallel: dict, single: bool, out: str
) -> None:
    """Log-probs of this rank's share, then one ``update_policy`` step on it (or one
    ``update_policy_single_pass``, which returns the log-probs of its forward)."""
    from rlpost.trainers.engine import WeightSource
    from rlpost.trainers.megatron.convert import megatron_to_hf

    parallel = dict(parallel)
    packing = parallel.pop("packing", False)  # engine settings, not a split
    device = parallel.pop("device", "cpu")
    engine = _megatron(
        model_dir,
        rank,
        world_size,
        port,
        parallel,
        micro_batch_size=3,
        packing=packing,
        **on(device),
    )
    full = make_batch(0)
    full.advantages_bt = advantages(full)
    batch = full.shard(rank, world_size)
    probe, greedy_expected = greedy_batch(model_dir)
    greedy = engine.greedy_match(probe.shard(rank, world_size))
    if single:
        metrics, logp = engine.update_policy_single_pass(batch, PolicyLossConfig())
    else:
        logp = engine.logprobs(batch)
        batch.old_logp_bt = logp
        metrics = engine.update_policy(batch, PolicyLossConfig())
    grads = None
    if not parallel.get("distributed_optimizer"):  # main_grad holds only a shard then
        grads = engine.gathered_state(lambda p: p.main_grad)
    weights = engine.named_weights()
    specs, streamed = streamed_weights(engine)  # the collective sync's source
    result = {"logp": logp, "metrics": metrics, "specs": specs, "streamed": streamed}
    result |= {"greedy": greedy, "greedy_expected": greedy_expected}
    result["is_weight_source"] = isinstance(engine, WeightSource)  # what the trainer worker checks
    if rank == 0:
        assert weights is not None
        result["weights"] = dict(weights)
        result["grads"] = megatron_to_hf(grads, engine.shape) if grads is not None else None
        result["num_params"] = engine.num_params
    torch.save(to_cpu(result), f"{out}.{rank}")
    engine.close()


def _fsdp_worker(rank: int, model_dir: str, port: int, out: str) -> None:
    from engine_utils import engine as fsdp_engine

    engine = fsdp_engine(model_dir, rank, 1, port, lr=LR, micro_batch_size=8)
    batch = make_batch(0)
    batch.advantages_bt = advantages(batch)
    batch.old_logp_bt = engine.logprobs(batch)
    metrics = engine.update_policy(batch, PolicyLossConfig())
    grads = full_grads(engine.model)
    result = {"metrics": metrics, "grads": grads, "weights": dict(engine.named_weights())}
    result["num_params"] = engine.num_params
    engine.close()
    torch.save(result, out)


def _sft_worker(rank: int, model_dir: str, port: int, save_dir: str, out: str) -> None:
    """10 SFT steps at tensor parallel 2, then an HF export and the engine's log-probs."""
    engine = _megatron(model_dir, rank, 2, port, {"tp": 2}, lr=3e-3, micro_batch_size=8)
    batch = make_batch(seed=2).shard(rank, 2)
    nll = [engine.update_sft(batch)["sft/nll"] for _ in range(10)]
    path = engine.save_hf(save_dir)
    logp = engine.logprobs(batch)
    torch.save({"nll": nll, "path": path, "logp": logp}, f"{out}.{rank}")
    engine.close()


# -- fixtures -------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(build_tiny_model("tiny", tmp_path_factory.mktemp("mg") / "m", seed=0))


@pytest.fixture(scope="module")
def fsdp_step(model_dir, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("fsdp") / "step.pt"
    _spawn(_fsdp_worker, (model_dir, free_port(), str(out)), 1)
    return torch.load(out)


@pytest.fixture(
    scope="module",
    params=[pytest.param(n, marks=pytest.mark.gpu) if n in GPU_LAYOUTS else n for n in LAYOUTS],
)
def megatron_step(request, model_dir, tmp_path_factory) -> dict:
    world_size, parallel, single = LAYOUTS[request.param]
    out = tmp_path_factory.mktemp(request.param) / "step.pt"
    args = (world_size, model_dir, free_port(), parallel, single, str(out))
    _spawn(_step_worker, args, world_size)
    ranks = [torch.load(f"{out}.{r}") for r in range(world_size)]
    result = ranks[0]
    result["logp"] = torch.cat([r["logp"] for r in ranks])  # each rank's own rows
    result["greedy"] = torch.cat([r["greedy"] for r in ranks])
    result["all_metrics"] = [r["metrics"] for r in ranks]
    result["others_streamed"] = [r["streamed"] for r in ranks[1:]]
    result["layout"] = request.param
    return result


def test_the_weight_stream_is_named_weights_a_part_at_a_time(megatron_step):
    """``weight_stream`` (the collective sync's source, one part gathered at a time)
    sends what ``named_weights`` gathers at once, in the order it announced; the
    other ranks take part and keep nothing."""
    check_stream(megatron_step["specs"], megatron_step["streamed"], megatron_step["weights"])
    assert all(s == [] for s in megatron_step["others_streamed"])
    assert megatron_step["is_weight_source"]  # rank, device, named_weights, weight_stream


# -- tests ----------------------------------------------------------------------
def test_logprobs_match_a_plain_transformers_forward(megatron_step, model_dir):
    from transformers import AutoModelForCausalLM

    batch = make_batch(0)
    ref_bt = hf_logprobs(AutoModelForCausalLM.from_pretrained(model_dir).eval(), batch)
    mask_bt = batch.response_mask_bt.bool()
    logp_bt = megatron_step["logp"]
    assert logp_bt.shape == batch.input_ids_bt.shape
    torch.testing.assert_close(logp_bt[mask_bt], ref_bt[mask_bt], rtol=0, atol=1e-4)
    assert torch.all(logp_bt[~mask_bt] == 0)
    # not a degenerate model: the response log-probs differ from token to token
    assert logp_bt[mask_bt].std() > 0.05


def test_greedy_match_finds_the_models_own_continuations(megatron_step):
    """The transformers model's greedy continuations match; a changed token does not."""
    assert megatron_step["greedy"].tolist() == megatron_step["greedy_expected"]


def test_one_update_matches_the_fsdp_engine(megatron_step, fsdp_step):
    ref, got = fsdp_step["metrics"], megatron_step["metrics"]

    # every rank reports the same global metrics
    def values(m: dict) -> dict:
        return {k: v for k, v in m.items() if not k.startswith("timing/")}

    for other in megatron_step["all_metrics"][1:]:
        assert values(other) == pytest.approx(values(got), rel=1e-9, abs=1e-12)
    # old_logp = logp: ratio 1, the loss is -sum_b A_b r_b / sum_b r_b (see test_fsdp_engine)
    assert got["actor/loss"] == pytest.approx(ref["actor/loss"], abs=1e-4)
    assert got["actor/pg_loss"] == pytest.approx(ref["actor/pg_loss"], abs=1e-4)
    assert got["actor/grad_norm"] == pytest.approx(ref["actor/grad_norm"], rel=1e-4)
    assert got["actor/entropy"] == pytest.approx(ref["actor/entropy"], rel=1e-4)
    assert got["actor/lr"] == ref["actor/lr"]
    assert got["actor/skipped_updates"] == 0.0
    assert megatron_step["num_params"] == fsdp_step["num_params"]
    if megatron_step["grads"] is not None:
        assert megatron_step["grads"].keys() == fsdp_step["grads"].keys()
        for name, grad in fsdp_step["grads"].items():
            torch.testing.assert_close(
                megatron_step["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name
            )
    # the same Adam step: weights agree except where a gradient is float noise
    # (Adam's first step moves every weight by ~lr * sign(grad))
    weights = megatron_step["weights"]
    assert weights.keys() == fsdp_step["weights"].keys()
    for name, w in fsdp_step["weights"].items():
        diff = (weights[name] - w).abs()
        assert diff.max() <= 2 * LR + 1e-6, name
        assert (diff > 1e-6).float().mean() < 0.01, name


def test_sft_at_tp2_lowers_the_nll_and_exports_the_trained_model(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "sft.pt"
    _spawn(_sft_worker, (model_dir, free_port(), str(tmp_path / "hf"), str(out)), 2)
    ranks = [torch.load(f"{out}.{r}") for r in range(2)]
    nll = ranks[0]["nll"]
    assert ranks[1]["nll"] == nll  # global metrics on both tensor-parallel ranks
    # random init: ~ln(104) = 4.64 nats; Adam at lr 3e-3 on one fixed batch lowers it each step
    assert nll[0] == pytest.approx(4.64, abs=0.3)
    assert all(b < a for a, b in zip(nll, nll[1:]))
    path = Path(ranks[0]["path"])
    assert ranks[1]["path"] is None
    # the export gathered both shards: transformers reproduces the engine's log-probs
    batch = make_batch(seed=2)
    ref_bt = hf_logprobs(AutoModelForCausalLM.from_pretrained(path).eval(), batch)
    got_bt = torch.cat([r["logp"] for r in ranks])
    torch.testing.assert_close(got_bt, ref_bt, rtol=0, atol=1e-4)
    start = hf_logprobs(AutoModelForCausalLM.from_pretrained(model_dir).eval(), batch)
    assert (ref_bt - start).abs().max() > 0.1  # and it is the trained model
