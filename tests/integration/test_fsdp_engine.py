"""FSDP2 engine on the CPU (gloo) and, under the ``gpu`` marker, on one CUDA GPU (NCCL):
log-prob parity, split-invariant updates, SFT, HF export.

Shapes: b = samples, t = tokens, v = vocab.

A process can hold one default process group, so every engine runs in a
fresh process (``torch.multiprocessing``) and hands its results back through
a file written by rank 0.
"""

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from engine_utils import (
    DEVICES,
    advantages,
    engine,
    free_port,
    greedy_batch,
    make_batch,
    one_rank_only,
    to_cpu,
)

from rlpost.algos import PolicyLossConfig
from rlpost.models.tiny import build_tiny_model
from rlpost.trainers.batch import TrajectoryBatch
from rlpost.trainers.fsdp.engine import FSDPEngine, token_logprobs

# (prompt tokens, response tokens) of the 8 test samples: ragged on purpose
LENGTHS = [(3, 4), (5, 2), (2, 7), (6, 1), (4, 5), (3, 3), (7, 6), (2, 2)]
# a small lr keeps Adam's first step (~ lr * sign(grad)) from amplifying
# float noise in near-zero gradients past the comparison tolerance
LR = 1e-4
PRELOAD = ["torch.distributed.fsdp", "rlpost.models.tiny", "rlpost.trainers.fsdp.engine"]


_free_port = free_port
_advantages = advantages


def _batch(seed: int = 0) -> TrajectoryBatch:
    return make_batch(seed, LENGTHS)


def _engine(model_dir: str, rank: int, world_size: int, port: int, **kw) -> FSDPEngine:
    kw.setdefault("lr", LR)
    return engine(model_dir, rank, world_size, port, **kw)


def _spawn(fn, args: tuple, nprocs: int = 1) -> None:
    """Run ``fn(rank, *args)`` in ``nprocs`` fresh processes and wait for them.

    They fork from a forkserver that imported torch, FSDP and the Qwen2
    model code once and ran no torch op, which keeps forking safe; a fresh
    interpreter per engine would spend ~7 s importing on 2 cores. (Preload
    names must import from the default path: the server does not get pytest's.)
    """
    mp.set_forkserver_preload(PRELOAD)
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")


# -- workers (module level so that the child processes can import them) --------
def _logprobs_worker(rank: int, model_dir: str, port: int, out: str, device: str) -> None:
    engine = _engine(model_dir, rank, 1, port, micro_batch_size=3, device=device)
    batch = _batch()
    result = {"t1": engine.logprobs(batch), "t2": engine.logprobs(batch, temperature=2.0)}
    probe, result["greedy_expected"] = greedy_batch(model_dir)
    result["greedy"] = engine.greedy_match(probe)
    engine.close()
    torch.save(to_cpu(result), out)


def _policy_worker(
    rank: int,
    world_size: int,
    model_dir: str,
    port: int,
    micro_batch_size: int,
    out: str,
    device: str,
) -> None:
    """One ``update_policy`` step on this rank's share of the 8-sample batch."""
    engine = _engine(
        model_dir, rank, world_size, port, micro_batch_size=micro_batch_size, device=device
    )
    full = _batch()
    full.advantages_bt = _advantages(full)
    batch = full.shard(rank, world_size)
    batch.old_logp_bt = engine.logprobs(batch)
    metrics = engine.update_policy(batch, PolicyLossConfig())
    # gradients stay on the parameters after the step; gather the full tensors
    grads = {}
    for name, p in engine.model.named_parameters():
        grads[name] = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
    weights = engine.named_weights()
    specs, items = engine.weight_stream()  # a layer gathered at a time (collective sync)
    streamed = [(name, tuple(t.shape), t.dtype, t.to("cpu", copy=True)) for name, t in items]
    # Where converting layer by layer would rename a tensor, the stream is the whole
    # state; it gathers only once iterated (rank 0 reads the specs alone).
    layerwise = engine._layerwise  # what the first stream found
    engine._layerwise, gathers, named = False, [], engine.named_weights
    engine.named_weights = lambda: gathers.append(1) or named()  # type: ignore[method-assign]
    _, whole = engine.weight_stream()
    lazy = gathers == []
    whole_streamed = [(name, t.to("cpu", copy=True)) for name, t in whole]
    if rank == 0:
        torch.save(
            {"metrics": metrics, "grads": to_cpu(grads), "weights": dict(weights), "rows": len(batch),
             "specs": specs, "streamed": streamed, "layerwise": layerwise, "lazy": lazy,
             "whole_streamed": whole_streamed, "gathers": len(gathers)},
            out,
        )  # fmt: skip
    else:
        assert streamed == []  # the other ranks gather with rank 0 and keep nothing
    engine.close()


def _sft_worker(rank: int, model_dir: str, port: int, save_dir: str, out: str, device: str) -> None:
    """20 SFT steps on one fixed batch, then an HF export."""
    engine = _engine(model_dir, rank, 1, port, lr=3e-3, micro_batch_size=8, device=device)
    batch = _batch(seed=2)
    nll = [engine.update_sft(batch)["sft/nll"] for _ in range(20)]
    path = engine.save_hf(save_dir)
    weights = dict(engine.named_weights())
    engine.close()
    torch.save({"nll": nll, "path": path, "weights": weights}, out)


# -- fixtures -------------------------------------------------------------------
@pytest.fixture(scope="module", params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(build_tiny_model("micro", tmp_path_factory.mktemp("fsdp") / "m", seed=0))


def _policy_step(
    tmp: Path, model_dir: str, world_size: int, micro_batch_size: int, device: str = "cpu"
) -> dict:
    out = tmp / f"policy_ws{world_size}_mbs{micro_batch_size}.pt"
    args = (world_size, model_dir, _free_port(), micro_batch_size, str(out), device)
    _spawn(_policy_worker, args, nprocs=world_size)
    return torch.load(out)


@pytest.fixture(scope="module")
def reference_step(model_dir, device, tmp_path_factory) -> dict:
    """world_size 1, the whole batch in one micro-batch."""
    return _policy_step(tmp_path_factory.mktemp("ref"), model_dir, 1, 8, device)


@pytest.fixture(scope="module")
def micro_step(model_dir, device, tmp_path_factory) -> dict:
    """world_size 1, micro-batches of 3, 3 and 2 samples."""
    return _policy_step(tmp_path_factory.mktemp("micro"), model_dir, 1, 3, device)


@pytest.fixture(scope="module")
def two_rank_step(model_dir, device, tmp_path_factory) -> dict:
    """world_size 2: each rank holds 4 of the 8 samples, in micro-batches of 3 and 1."""
    one_rank_only(device, 2)
    return _policy_step(tmp_path_factory.mktemp("ws2"), model_dir, 2, 3)


@pytest.fixture(scope="module")
def sft_run(model_dir, device, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("sft")
    _spawn(_sft_worker, (model_dir, _free_port(), str(tmp / "hf"), str(tmp / "sft.pt"), device))
    return torch.load(tmp / "sft.pt")


def _assert_same_step(result: dict, reference: dict, initial: dict) -> None:
    # the pre-clip gradient norm is the global one: Adam's first step is
    # scale-invariant, so this and the gradients catch a wrong loss scale
    assert result["metrics"]["actor/grad_norm"] == pytest.approx(
        reference["metrics"]["actor/grad_norm"], rel=1e-6
    )
    assert result["grads"].keys() == reference["grads"].keys()
    for name, grad in reference["grads"].items():
        torch.testing.assert_close(result["grads"][name], grad, rtol=1e-5, atol=1e-7, msg=name)
    moved = 0.0
    for name, w in reference["weights"].items():
        torch.testing.assert_close(result["weights"][name], w, rtol=0, atol=1e-6, msg=name)
        moved = max(moved, (w - initial[name]).abs().max().item())
    # Adam's first step moves a parameter by ~lr: the comparison is not vacuous
    assert moved > 0.5 * LR


def _initial_weights(model_dir: str) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).state_dict()


# -- tests ----------------------------------------------------------------------
def test_token_logprobs_hand_values_and_cross_entropy_parity():
    # v = 2; logits are logs of unnormalised weights, so p = weight / sum:
    # t=0 weights (1, 3) -> p(1) = 3/4; t=1 weights (3, 1) -> p(0) = 3/4
    # ids (0, 1, 0): logp = (0, ln p_0(1), ln p_1(0)) = (0, ln 0.75, ln 0.75) = (0, -0.2877, -0.2877)
    logits = torch.tensor([[[1.0, 3.0], [3.0, 1.0], [5.0, 5.0]]]).log()
    ids = torch.tensor([[0, 1, 0]])
    expected = torch.tensor([[0.0, -0.28768207, -0.28768207]])
    torch.testing.assert_close(token_logprobs(logits, ids), expected)

    g = torch.Generator().manual_seed(0)
    logits_btv = torch.randn(3, 7, 11, generator=g) * 3
    ids_bt = torch.randint(0, 11, (3, 7), generator=g)
    ce = F.cross_entropy(
        logits_btv[:, :-1].reshape(-1, 11), ids_bt[:, 1:].reshape(-1), reduction="none"
    ).view(3, 6)
    logp_bt = token_logprobs(logits_btv, ids_bt)
    assert logp_bt.shape == (3, 7)
    assert torch.all(logp_bt[:, 0] == 0)
    torch.testing.assert_close(logp_bt[:, 1:], -ce, rtol=0, atol=1e-6)


def test_logprobs_match_a_plain_transformers_forward(model_dir, device, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "logp.pt"
    _spawn(_logprobs_worker, (model_dir, _free_port(), str(out), device))
    got = torch.load(out)

    batch = _batch()
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        logits_btv = model(
            input_ids=batch.input_ids_bt, attention_mask=batch.attention_mask_bt
        ).logits
    mask_bt = batch.response_mask_bt.bool()
    for key, temperature in (("t1", 1.0), ("t2", 2.0)):
        logp_btv = torch.log_softmax(logits_btv[:, :-1] / temperature, dim=-1)
        ref_bt = logp_btv.gather(-1, batch.input_ids_bt[:, 1:, None]).squeeze(-1)
        ref_bt = F.pad(ref_bt, (1, 0))
        logp_bt = got[key]
        assert logp_bt.shape == batch.input_ids_bt.shape
        torch.testing.assert_close(logp_bt[mask_bt], ref_bt[mask_bt], rtol=0, atol=1e-5)
        assert torch.all(logp_bt[~mask_bt] == 0)
        # not a degenerate model: the response log-probs differ from token to token
        assert logp_bt[mask_bt].std() > 0.05
    # the temperature divides the logits before the softmax
    assert not torch.allclose(got["t1"][mask_bt], got["t2"][mask_bt])
    # greedy_match: the model's own greedy continuations, and one token changed in the others
    assert got["greedy"].tolist() == got["greedy_expected"]


def test_update_is_invariant_to_micro_batch_size(model_dir, reference_step, micro_step):
    _assert_same_step(micro_step, reference_step, _initial_weights(model_dir))


def test_two_ranks_match_one_rank_on_the_full_batch(model_dir, reference_step, two_rank_step):
    assert two_rank_step["rows"] == 4  # rank 0 held half the batch
    _assert_same_step(two_rank_step, reference_step, _initial_weights(model_dir))


@pytest.mark.parametrize("run", ["reference_step", "two_rank_step"])
def test_the_weight_stream_is_named_weights_a_layer_at_a_time(run, device, request):
    """``weight_stream`` (the collective weight sync's source): the same tensors as
    ``named_weights``, announced up front (names, shapes, dtypes in stream order),
    converted layer by layer without falling back to the whole state."""
    got = request.getfixturevalue(run)
    assert got["layerwise"]
    assert [(n, s, d) for n, s, d, _ in got["streamed"]] == got["specs"]
    # the whole-state fallback: nothing gathered before it is iterated, once after
    assert got["lazy"] and got["gathers"] == 1
    assert {n: t for n, t in got["whole_streamed"]}.keys() == got["weights"].keys()
    assert sorted(n for n, *_ in got["streamed"]) == sorted(got["weights"])
    for name, _, _, tensor in got["streamed"]:
        assert torch.equal(tensor, got["weights"][name]), name


@pytest.mark.parametrize("run", ["reference_step", "micro_step", "two_rank_step"])
def test_logged_policy_loss_is_the_global_batch_loss(run, device, request):
    # old_logp = logp, so ratio = 1 and nothing is clipped: per token pg = -A_b.
    # token-mean over the global batch: loss = -sum_b A_b r_b / sum_b r_b with
    # r_b the response lengths (4, 2, 7, 1, 5, 3, 6, 2), sum 30. The trainer
    # averages metrics over ranks, so every rank must report this global value.
    batch = _batch()
    adv_bt = _advantages(batch)
    expected = float(-adv_bt.sum() / batch.response_mask_bt.sum())
    assert int(batch.response_mask_bt.sum()) == 30
    metrics = request.getfixturevalue(run)["metrics"]
    assert metrics["actor/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["actor/pg_clipfrac"] == 0.0
    assert metrics["actor/loss"] == pytest.approx(expected, abs=1e-6)
    assert metrics["actor/pg_loss"] == pytest.approx(expected, abs=1e-6)


def test_sft_lowers_the_nll_of_a_fixed_batch(sft_run):
    nll = sft_run["nll"]
    assert len(nll) == 20
    # random init: NLL ~ ln(104) = 4.64 nats per token
    assert nll[0] == pytest.approx(4.64, abs=0.3)
    # Adam at lr 3e-3 on one fixed batch: every step lowers it (4.61 -> 0.95 when written)
    assert all(b < a for a, b in zip(nll, nll[1:]))
    assert nll[-1] < 0.5 * nll[0]


def test_save_hf_round_trips_the_trained_weights(sft_run, model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(sft_run["path"])
    assert (path / "config.json").exists()
    assert not path.with_name(path.name + ".tmp").exists()
    loaded = AutoModelForCausalLM.from_pretrained(path).state_dict()
    weights = sft_run["weights"]
    assert set(loaded) == set(weights)
    for name, w in weights.items():
        assert torch.equal(loaded[name], w), name
    # the exported weights are the trained ones, not a copy of the start
    initial = _initial_weights(model_dir)
    assert not torch.equal(
        loaded["model.embed_tokens.weight"], initial["model.embed_tokens.weight"]
    )
    assert torch.equal(loaded["lm_head.weight"], loaded["model.embed_tokens.weight"])
    assert AutoTokenizer.from_pretrained(path).eos_token == "<|end|>"


def _bf16_worker(rank: int, model_dir: str, port: int, out: str, device: str) -> None:
    """One bf16 update of the 8-sample batch, whole and in micro-batches of 3: on one
    rank FSDP2 adds the micro-batches' gradients in float32 and reduces them once.
    Both decoder layers share one FSDP2 group (``layer_groups``); a third engine has a
    group per layer, as several ranks do."""
    from engine_utils import full_grads

    from rlpost.trainers.fsdp import common

    got = {}
    budget = common.group_budget
    for name, size, per_layer in (("whole", 8, False), ("split", 3, False), ("per_layer", 3, True)):
        if per_layer:
            common.group_budget = lambda device_type: 0  # every layer a group of its own
        e = _engine(model_dir, rank, 1, port, micro_batch_size=size, device=device,
                    mixed_precision="bf16")  # fmt: skip
        common.group_budget = budget
        batch = _batch()
        batch.advantages_bt = _advantages(batch)
        batch.old_logp_bt = e.logprobs(batch)
        metrics = e.update_policy(batch, PolicyLossConfig())
        grads, weights = full_grads(e.model), dict(e.named_weights())
        got[name] = {"grads": grads, "weights": weights, "metrics": metrics}
        del e
    torch.save(to_cpu(got), out)


def test_bf16_micro_batches_accumulate_to_the_whole_batch(model_dir, device, tmp_path):
    out = tmp_path / "bf16.pt"
    _spawn(_bf16_worker, (model_dir, _free_port(), str(out), device))
    got = torch.load(out)
    whole, split = got["whole"], got["split"]
    assert whole["grads"].keys() == split["grads"].keys() and len(whole["grads"]) > 0
    # the same loss over the same tokens, computed in bf16 in other groupings: the
    # gradients agree to bf16's rounding (2^-8 = 0.4 %), a lost or doubled micro-batch
    # would be off by 3/8 or more
    norm = whole["metrics"]["actor/grad_norm"]
    assert split["metrics"]["actor/grad_norm"] == pytest.approx(norm, rel=2e-2)
    for name, g in whole["grads"].items():
        assert g.dtype == torch.float32, name  # fp32 master gradients
        scale = float(g.abs().max()) + 1e-12
        torch.testing.assert_close(split["grads"][name], g, rtol=0, atol=3e-2 * scale, msg=name)
    # FSDP2 groups change when the hooks run, not what is computed: a group per layer
    # gives the same gradients and weights, bit for bit
    per_layer = got["per_layer"]
    timeless = [
        {k: v for k, v in m.items() if not k.startswith("timing/")}
        for m in (per_layer["metrics"], split["metrics"])
    ]
    assert timeless[0] == timeless[1]
    for key in ("grads", "weights"):
        assert per_layer[key].keys() == split[key].keys()
        for name, t in split[key].items():
            assert torch.equal(per_layer[key][name], t), (key, name)


# -- a vocabulary large enough for the chunked output layer ---------------------
def _wide_worker(rank: int, model_dir: str, port: int, out: str, device: str) -> None:
    """One ``update_policy`` step of the whole batch as one micro-batch, whose
    8 x 13 x 49,152 logits are past the plain path's 4 M: the output layer runs
    a chunk at a time, on the response tokens only."""
    engine = _engine(model_dir, rank, 1, port, micro_batch_size=8, device=device)
    batch = _batch()
    batch.advantages_bt = _advantages(batch)
    batch.old_logp_bt = engine.logprobs(batch)
    metrics = engine.update_policy(batch, PolicyLossConfig())
    grads = {n: p.grad for n, p in engine.model.named_parameters() if p.grad is not None}
    result = {"fused": engine._head is not None, "logp": batch.old_logp_bt, "grads": grads}
    engine.close()
    torch.save(to_cpu({**result, "metrics": metrics}), out)


def test_a_large_vocabulary_updates_like_the_plain_loss(device, tmp_path):
    """The chunked output layer over the response tokens alone gives a plain
    transformers loss's gradients: at ratio 1 the clipped loss is
    -sum(A_t logp_t) / (response tokens), so its gradient is that of the plain
    -cross-entropy log-probs weighted by the advantages."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=49_152, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
        initializer_range=0.2,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "wide")
    out = tmp_path / "wide.pt"
    _spawn(_wide_worker, (str(tmp_path / "wide"), _free_port(), str(out), device))
    got = torch.load(out)
    assert got["fused"]

    batch = _batch()
    mask_bt = batch.response_mask_bt.float()
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "wide")
    logits_btv = model(input_ids=batch.input_ids_bt, attention_mask=batch.attention_mask_bt).logits
    ce_bt = F.cross_entropy(
        logits_btv[:, :-1].transpose(1, 2), batch.input_ids_bt[:, 1:], reduction="none"
    )
    logp_bt = F.pad(-ce_bt, (1, 0))
    (-(_advantages(batch) * logp_bt * mask_bt).sum() / mask_bt.sum()).backward()
    want = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    on = batch.response_mask_bt.bool()
    torch.testing.assert_close(got["logp"][on], logp_bt.detach()[on], rtol=0, atol=1e-5)
    assert torch.all(got["logp"][~on] == 0)
    assert got["grads"].keys() == want.keys()
    # the norm before clipping is the plain gradient's; the engine then clipped to 1.0
    norm = torch.cat([g.flatten() for g in want.values()]).norm().item()
    assert got["metrics"]["actor/grad_norm"] == pytest.approx(norm, rel=1e-5)
    assert norm > 1.0  # the clip is not vacuous: every gradient scaled by 1 / norm
    for name, g in want.items():
        torch.testing.assert_close(got["grads"][name], g / norm, rtol=1e-4, atol=1e-6, msg=name)


# -- the host runs ahead of the device -------------------------------------------
def _waits_worker(rank: int, model_dir: str, out: str, device: str) -> None:
    """Where rlpost's own code waits for the device during ``update_policy``, with 1
    and with 4 micro-batches (torch's synchronisation debug mode warns at each wait)."""
    import warnings

    from rlpost.runtime import device as devices

    sites: dict[int, list[str]] = {}
    for micro in (8, 2):
        engine = _engine(model_dir, rank, 1, _free_port(), micro_batch_size=micro, device=device)
        batch = _batch()
        batch.advantages_bt = _advantages(batch)
        batch.old_logp_bt = engine.logprobs(batch)
        devices.synchronize(device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if device == "cuda":
                torch.cuda.set_sync_debug_mode("warn")
            engine.update_policy(batch, PolicyLossConfig())
            if device == "cuda":
                torch.cuda.set_sync_debug_mode("default")
        sites[8 // micro] = sorted(
            f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)
        )
        engine.close()
    torch.save(sites, out)


@pytest.mark.gpu
def test_micro_batches_add_no_waits_for_the_device(tmp_path):
    """A step waits for the device a fixed number of times (its gradient norm, its
    metrics), not once per micro-batch: between a micro-batch's forward and backward
    the host queues on, so the device never idles while the host launches kernels."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model_dir = str(build_tiny_model("micro", tmp_path / "m", seed=0))
    out = tmp_path / "waits.pt"
    _spawn(_waits_worker, (model_dir, str(out), "cuda"))
    sites = torch.load(out)
    ours = {n: [s for s in found if "/site-packages/" not in s] for n, found in sites.items()}
    assert len(ours[4]) == len(ours[1]), ours
