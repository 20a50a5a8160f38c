"""Helpers for engine-level tests: fresh processes, ragged batches, parity against
plain transformers, and the devices an engine test runs on.

Shapes: b = samples, t = tokens.

A process holds one default process group, so each engine runs in a fresh
process forked from a forkserver that imported torch, FSDP and the Qwen2 code
once (a fresh interpreter would spend ~7 s importing on 2 cores).
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from ports import free_port  # noqa: F401  (re-exported for the engine tests)

from rlpost.runtime import device as devices
from rlpost.trainers.batch import TrajectoryBatch, pad_sequences
from rlpost.trainers.fsdp.engine import FSDPEngine, FSDPEngineConfig

PRELOAD = ["torch.distributed.fsdp", "rlpost.models.tiny", "rlpost.trainers.fsdp.engine", "peft"]
# (prompt tokens, response tokens): ragged on purpose
LENGTHS = [(3, 4), (5, 2), (2, 7), (6, 1), (4, 5), (3, 3), (7, 6), (2, 2)]


def spawn(fn, args: tuple, nprocs: int = 1) -> None:
    """Run ``fn(rank, *args)`` in ``nprocs`` fresh processes and wait for them."""
    mp.set_forkserver_preload(PRELOAD)
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")


# The devices an engine test runs on: the CPU always; a CUDA GPU under the ``gpu``
# marker (skipped where none is present, run by bench/gpu_check.sh). One rank per GPU:
# NCCL refuses two ranks on one device, so multi-rank cases stay on the CPU.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def on(device: str) -> dict:
    """An engine config's ``device`` and the process-group backend it takes."""
    return {"device": device, "backend": devices.kind(device).backend}


def one_rank_only(device: str, world_size: int) -> None:
    if device != "cpu" and world_size > 1:
        pytest.skip("one GPU holds one NCCL rank: several ranks run on the CPU")


def to_cpu(value):  # type: ignore[no-untyped-def]
    """Tensors (in dicts, lists and tuples) moved to the CPU, for a test to compare."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    return value


def engine(
    model_dir: str, rank: int, world_size: int, port: int, device: str = "cpu", **kw
) -> FSDPEngine:
    kw = {"lr": 1e-3, "lr_warmup_steps": 0, **on(device), **kw}  # these tests' own rate
    cfg = FSDPEngineConfig(model_path=model_dir, **kw)
    return FSDPEngine(cfg, rank, world_size, f"tcp://127.0.0.1:{port}")


def make_batch(seed: int = 0, lengths: list[tuple[int, int]] | None = None) -> TrajectoryBatch:
    """Right-padded samples of printable-character ids with a response suffix."""
    g = torch.Generator().manual_seed(seed)
    lengths = lengths or LENGTHS
    return batch_of(
        [torch.randint(5, 100, (p + r,), generator=g).tolist() for p, r in lengths], lengths
    )


def batch_of(ids: list[list[int]], lengths: list[tuple[int, int]]) -> TrajectoryBatch:
    """Right-padded rows of ``ids``, each ``(prompt, response)`` tokens long."""
    return TrajectoryBatch(
        input_ids_bt=pad_sequences(ids, 0),
        attention_mask_bt=pad_sequences([[1] * len(s) for s in ids], 0),
        response_mask_bt=pad_sequences([[0] * p + [1] * r for p, r in lengths], 0),
    )


@torch.no_grad()
def greedy_batch(model_dir: str) -> tuple[TrajectoryBatch, list[bool]]:
    """``make_batch(0)``'s prompts, each followed by the transformers model's own greedy
    continuation of its response length; in every other row (the odd ones) one response
    token is changed, so that row is not the model's choice. Returns the batch and, per
    row, whether it is the greedy continuation: what ``greedy_match`` must say."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    vocab = model.config.vocab_size
    base = make_batch(0)
    ids, expected = [], []
    for row, (p, r) in enumerate(LENGTHS):
        seq = base.input_ids_bt[row, :p].clone()
        for _ in range(r):
            nxt = model(input_ids=seq[None]).logits[0, -1].argmax()
            seq = torch.cat([seq, nxt[None]])
        if row % 2:
            at = p + row % r  # a response position (one token: the only one)
            seq[at] = (seq[at] + 1) % vocab
        ids.append(seq.tolist())
        expected.append(row % 2 == 0)
    return batch_of(ids, LENGTHS), expected


def advantages(batch: TrajectoryBatch, seed: int = 1) -> torch.Tensor:
    adv_b = torch.randn(len(batch), generator=torch.Generator().manual_seed(seed))
    return adv_b[:, None] * batch.response_mask_bt


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded state dict (collective; one rank's model is not sharded)."""
    return {
        k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu()
        for k, v in model.state_dict().items()
    }


def full_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded gradients of every parameter that has one (collective)."""
    out = {}
    for name, p in model.named_parameters():
        if p.grad is not None:
            g = p.grad
            out[name] = (g.full_tensor() if hasattr(g, "full_tensor") else g).to("cpu", copy=True)
    return out


@torch.no_grad()
def hf_logprobs(model: torch.nn.Module, batch: TrajectoryBatch) -> torch.Tensor:
    """Independent reference: a plain transformers forward, -cross-entropy per token."""
    logits_btv = model(input_ids=batch.input_ids_bt, attention_mask=batch.attention_mask_bt).logits
    ce_bt = F.cross_entropy(
        logits_btv[:, :-1].transpose(1, 2).float(), batch.input_ids_bt[:, 1:], reduction="none"
    )
    return F.pad(-ce_bt, (1, 0)) * batch.response_mask_bt


def streamed_weights(engine) -> tuple[list, list[tuple[str, torch.Tensor]]]:
    """``engine.weight_stream()`` run to its end (collective: every rank calls it):
    the specs and the tensors, copied as they arrive (rank 0's; none elsewhere)."""
    specs, items = engine.weight_stream()
    return specs, [(name, tensor.detach().to("cpu", copy=True)) for name, tensor in items]


def check_stream(specs: list, streamed: list, weights: dict[str, torch.Tensor]) -> None:
    """The stream announced its tensors in the order it sent them, and sent exactly
    ``named_weights`` (``weights``), bit for bit."""
    assert [(n, tuple(t.shape), t.dtype) for n, t in streamed] == list(specs)
    assert sorted(n for n, _ in streamed) == sorted(weights)
    for name, tensor in streamed:
        assert torch.equal(tensor, weights[name]), name


def assert_same_update(got: dict, ref: dict, mask_bt: torch.Tensor) -> None:
    """Two engines' log-probs (on ``mask_bt``), gradients and update metrics agree
    within float32 rounding, and the reference's step is a real one."""
    torch.testing.assert_close(got["logp"][mask_bt], ref["logp"][mask_bt], rtol=0, atol=1e-5)
    assert got["grads"].keys() == ref["grads"].keys() and ref["grads"]
    for name, g in ref["grads"].items():
        torch.testing.assert_close(got["grads"][name], g, rtol=1e-5, atol=1e-6, msg=name)
    for key in ("actor/loss", "actor/entropy", "actor/grad_norm"):
        assert got["m"][key] == pytest.approx(ref["m"][key], rel=1e-5), key
    # not vacuous: the step has gradients of a real size
    assert ref["m"]["actor/grad_norm"] > 1e-3
