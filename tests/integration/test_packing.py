"""Memory and speed switches change nothing numerically: packed sequences, token-budget
micro-batches, gradient checkpointing and CPU offload give the padded fixed-count
path's log-probs and gradients.

Shapes: b = samples, t = tokens.
"""

from __future__ import annotations

import pytest
import torch
from engine_utils import (
    DEVICES,
    advantages,
    assert_same_update,
    engine,
    free_port,
    full_grads,
    make_batch,
    spawn,
)

from rlpost.algos import PolicyLossConfig
from rlpost.models.tiny import build_tiny_model
from rlpost.trainers.fsdp.engine import RegularizerConfig
from rlpost.trainers.fsdp.lora import LoraSettings
from rlpost.trainers.micro_batching import micro_batches, pack, unpack

# name -> engine settings; "padded" (8 rows in one padded micro-batch) is the reference
VARIANTS = {
    "padded": dict(micro_batch_size=8),
    "packed": dict(micro_batch_size=8, packing=True),
    "packed_micro": dict(micro_batch_size=3, packing=True),
    "tokens_padded": dict(micro_batch_tokens=20),
    "tokens_packed": dict(micro_batch_tokens=20, packing=True),
    "checkpointing": dict(micro_batch_size=3, gradient_checkpointing=True),
    "offload": dict(micro_batch_size=3, param_offload=True, optimizer_offload=True),
    "lora_padded": dict(micro_batch_size=8, lora=LoraSettings(rank=4)),
    "lora_packed_ckpt": dict(
        micro_batch_size=3, packing=True, gradient_checkpointing=True, lora=LoraSettings(rank=4)
    ),
}
REG = RegularizerConfig(entropy_coef=0.01)  # the entropy path is packed too


def _worker(rank: int, model_dir: str, port: int, out: str, device: str) -> None:
    """Every variant in one process (they share its process group): log-probs and the
    gradients of one update step, with the parameters seen before it."""
    results = {}
    for name, kw in VARIANTS.items():
        eng = engine(model_dir, rank, 1, port, device, lr=1e-4, **kw)
        batch = make_batch()
        batch.advantages_bt = advantages(batch)
        # B = 0 at init would give lora_A no gradient: nudge B so both get one
        for n, p in eng.model.named_parameters():
            if ".lora_B." in n:
                with torch.no_grad():
                    p.fill_(0.01)
        batch.old_logp_bt = eng.logprobs(batch)
        metrics = eng.update_policy(batch, PolicyLossConfig(), reg=REG)
        results[name] = {"logp": batch.old_logp_bt, "grads": full_grads(eng.model), "m": metrics}
        del eng
    torch.save(results, out)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(build_tiny_model("micro", tmp_path_factory.mktemp("pack") / "m", 0, init_std=0.3))


@pytest.fixture(scope="module", params=DEVICES)
def results(request, model_dir, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("pack_run") / "out.pt"
    spawn(_worker, (model_dir, free_port(), str(out), request.param))
    return torch.load(out, weights_only=False)


def test_token_budget_groups_rows_greedily():
    # row lengths 7, 7, 9, 7, 9, 6, 13, 4 (prompt + response of LENGTHS)
    batch = make_batch()
    # padded cost = rows x longest: 7,14 | 27>20 -> [0,1]; 9,18 | 27 -> [2,3];
    # 9,18 | 39 -> [4,5]; 13 | 26 -> [6]; [7]
    assert [len(mb) for mb in micro_batches(batch, 8, tokens=20)] == [2, 2, 2, 1, 1]
    # packed cost = sum of lengths: 7,14 | 23 -> [0,1]; 9,16 | 25 -> [2,3];
    # 9,15 | 28 -> [4,5]; 13,17 -> [6,7]
    assert [len(mb) for mb in micro_batches(batch, 8, tokens=20, packed=True)] == [2, 2, 2, 2]
    # a row over the budget gets its own group instead of failing
    assert [len(mb) for mb in micro_batches(batch, 8, tokens=5, packed=True)] == [1] * 8


def test_pack_has_no_padding_and_restarts_positions():
    batch = make_batch(lengths=[(1, 2), (2, 3)])  # lengths 3 and 5
    ids_1T, pos_1T, lengths = pack(batch)
    assert lengths == [3, 5]
    assert pos_1T.tolist() == [[0, 1, 2, 0, 1, 2, 3, 4]]
    assert ids_1T[0, 3:].tolist() == batch.input_ids_bt[1].tolist()
    # unpack zeroes each row's first position (a prediction across the boundary)
    vals_1T = torch.arange(1.0, 9.0)[None]
    assert unpack(vals_1T, lengths, 6).tolist() == [[0, 2, 3, 0, 0, 0], [0, 5, 6, 7, 8, 0]]


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v not in ("padded", "lora_padded")])
def test_variant_matches_the_padded_path(variant, results):
    ref = results["lora_padded" if variant.startswith("lora") else "padded"]
    got = results[variant]
    mask = make_batch().response_mask_bt.bool()
    assert_same_update(got, ref, mask)


def _bf16_worker(rank: int, model_dir: str, device: str, port: int, out: str) -> None:
    eng = engine(model_dir, rank, 1, port, device, mixed_precision="bf16")
    batch = make_batch()
    batch.advantages_bt = advantages(batch)
    batch.old_logp_bt = eng.logprobs(batch).cpu()
    metrics = eng.update_policy(batch, PolicyLossConfig())
    dtypes = {p.dtype for p in eng.model.parameters()}
    torch.save({"logp": batch.old_logp_bt, "m": metrics, "dtypes": dtypes}, out)
    eng.close()


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_mixed_precision_keeps_fp32_master_weights(device, model_dir, tmp_path):
    """bf16 compute (on the CPU too, where bf16 instructions make it ~2.5x faster):
    the log-probs are a bf16 model's, not the fp32 model's, and the weights the
    optimizer steps stay fp32."""
    from engine_utils import hf_logprobs
    from transformers import AutoModelForCausalLM

    out = tmp_path / "bf16.pt"
    spawn(_bf16_worker, (model_dir, device, free_port(), str(out)))
    got = torch.load(out, weights_only=False)
    assert got["dtypes"] == {torch.float32}
    mask = make_batch().response_mask_bt.bool()
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        fp32 = hf_logprobs(model, make_batch())[mask]
        bf16 = hf_logprobs(model.to(torch.bfloat16), make_batch())[mask].float()
    err_fp32 = (got["logp"][mask] - fp32).abs().max()
    err_bf16 = (got["logp"][mask] - bf16).abs().max()
    assert 0.01 < err_fp32 < 0.5, err_fp32  # rounded to bf16, not a different model
    assert err_bf16 < err_fp32 / 2, (err_bf16, err_fp32)  # nearer a bf16 model (0.07 vs 0.17)
    assert torch.isfinite(torch.tensor(got["m"]["actor/grad_norm"]))
    assert got["m"]["actor/grad_norm"] > 1e-3
