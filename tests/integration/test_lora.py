"""LoRA in the FSDP2 engine: only the adapter trains, the adapter-disabled model is
the reference policy, and merged weights (or the adapter itself) reproduce the
trainer's log-probs in a plain transformers model and in real vLLM.

Shapes: b = samples, t = tokens.
"""

from __future__ import annotations

import pytest
import torch
from engine_utils import DEVICES, advantages, engine, free_port, hf_logprobs, make_batch, spawn

from rlpost.algos import PolicyLossConfig
from rlpost.models.tiny import build_tiny_model
from rlpost.trainers.fsdp.lora import LoraSettings

LORA = LoraSettings(rank=8, alpha=16.0)
STEPS = 3


def _lora_worker(rank: int, model_dir: str, port: int, out: str, device: str) -> None:
    # lr 5e-2: three Adam steps move the adapter far enough to change log-probs
    eng = engine(model_dir, rank, 1, port, device, lora=LORA, lr=5e-2, micro_batch_size=8)
    batch = make_batch()
    result: dict = {
        "trainable": sorted(n for n, p in eng.model.named_parameters() if p.requires_grad),
        "num_params": eng.num_params,
        "num_trainable": eng.num_trainable,
        "ref_before": eng.ref_logprobs(batch),
        "policy_before": eng.logprobs(batch),
    }
    batch.advantages_bt = advantages(batch)
    for _ in range(STEPS):
        batch.old_logp_bt = eng.logprobs(batch)
        eng.update_policy(batch, PolicyLossConfig())
    optimizer = eng.updater.optimizer  # type: ignore[union-attr]
    result["optim_numel"] = sum(p.numel() for g in optimizer.param_groups for p in g["params"])
    result["optim_state_bytes"] = sum(
        v.numel() * v.element_size()
        for s in optimizer.state.values()
        for v in s.values()
        if torch.is_tensor(v)
    )
    result["policy_after"] = eng.logprobs(batch)
    result["ref_after"] = eng.ref_logprobs(batch)
    result["merged"] = dict(eng.named_weights())  # type: ignore[arg-type]
    result["adapter"] = eng.adapter_weights()
    eng.close()
    torch.save(result, out)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    # init_std 0.3: varied samples from an untrained model (see test_tiny_vllm)
    return str(build_tiny_model("micro", tmp_path_factory.mktemp("lora") / "m", 0, init_std=0.3))


@pytest.fixture(scope="module", params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def run(model_dir, device, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("lora_run") / "out.pt"
    spawn(_lora_worker, (model_dir, free_port(), str(out), device))
    return torch.load(out, weights_only=False)


def _base(model_dir: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


def _merged(model_dir: str, weights: dict):
    model = _base(model_dir)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embeddings
    return model


def test_only_the_adapter_trains_and_sits_in_the_optimizer(run):
    names = run["trainable"]
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    # micro preset, hidden 64, 2 layers, kv dim 32 (1 kv head x 32), mlp 128;
    # rank 8 adds r * (in + out) per adapted linear:
    # q, o: 8 * (64 + 64) = 1024 each; k, v: 8 * (64 + 32) = 768 each;
    # gate, up, down: 8 * (64 + 128) = 1536 each -> 8192 per layer, 16384 in all
    assert run["num_trainable"] == 16384
    assert run["optim_numel"] == 16384
    # Adam keeps two fp32 moments per trainable element (+ a scalar step per tensor)
    assert run["optim_state_bytes"] == pytest.approx(2 * 4 * 16384, rel=0.01)
    assert run["num_params"] > 5 * run["num_trainable"]


def test_disabled_adapter_is_the_base_model(run, model_dir):
    batch = make_batch()
    base = hf_logprobs(_base(model_dir), batch)
    for key in ("ref_before", "ref_after", "policy_before"):
        # before any update B = 0, so the adapter is a no-op as well
        torch.testing.assert_close(run[key], base, rtol=0, atol=1e-5, msg=key)
    # the trained adapter does change the policy, so the check above can fail
    assert (run["policy_after"] - base).abs().max() > 1e-2


def test_merged_weights_reproduce_the_trainer(run, model_dir):
    merged = run["merged"]
    assert set(merged) == set(_base(model_dir).state_dict())  # plain HF names
    got = hf_logprobs(_merged(model_dir, merged), make_batch())
    # merged, W + (alpha/r) B A is rounded to fp32 once; the trainer adds the two
    # branches' outputs instead: a few 1e-6 relative on log-probs of ~-5
    torch.testing.assert_close(got, run["policy_after"], rtol=0, atol=1e-4)


def _vllm_parity(llm, model_dir: str, reference, tokenizer) -> float:
    from rlpost.data.samples import rollout_batch
    from rlpost.rollout.base import GenerationRequest, SamplingConfig

    sampling = SamplingConfig(n=4, temperature=1.0, max_tokens=6, seed=0)
    prompts = [tokenizer.encode(p) for p in ("12+7=", "hello", "3+4")]
    results = llm.generate([GenerationRequest(p, sampling) for p in prompts])
    batch = rollout_batch(results, tokenizer.pad_token_id)
    mask = batch.response_mask_bt.bool()
    assert batch.rollout_logp_bt is not None
    return float((hf_logprobs(reference, batch) - batch.rollout_logp_bt)[mask].abs().max())


@pytest.fixture(scope="module")
def vllm_engine(model_dir):
    pytest.importorskip("vllm")
    from rlpost.rollout.vllm import VLLMEngine, VLLMEngineConfig

    threads = torch.get_num_threads()
    eng = VLLMEngine(VLLMEngineConfig(model_path=model_dir, kv_cache_gib=0.0625, lora=8))
    torch.set_num_threads(threads)
    return eng


def test_vllm_adapter_and_merged_sync_match_the_trainer(run, model_dir, vllm_engine):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trained = _merged(model_dir, run["merged"])
    # adapter mode: base weights + LoRA request
    vllm_engine.load_lora_adapter(run["adapter"])
    assert _vllm_parity(vllm_engine, model_dir, trained, tokenizer) < 1e-3
    # the parity check can fail: the base model is far from the trained policy
    assert _vllm_parity(vllm_engine, model_dir, _base(model_dir), tokenizer) > 1e-2
    # merged mode: the merged weights already hold the update, so they are
    # served without the adapter (with it the update would count twice)
    vllm_engine.load_lora_adapter(None)
    vllm_engine.load_weights(run["merged"].items())
    assert _vllm_parity(vllm_engine, model_dir, trained, tokenizer) < 1e-3
