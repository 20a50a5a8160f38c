"""The locally built tiny model loads in transformers and in real vLLM (CPU),
and both engines agree token for token under greedy decoding."""

from __future__ import annotations

import time

import pytest
import torch

from rlpost.models.tiny import build_tiny_model

CONTENTS = ["37+48=", "hello world", "a b\n c"]
MAX_NEW = 8


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # init_std 0.3: an untrained model at the default 0.02 repeats its last
    # input token, which would make the parity check trivially true.
    return build_tiny_model("micro", tmp_path_factory.mktemp("tiny") / "micro", 0, init_std=0.3)


@pytest.fixture(scope="module")
def hf(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    return tokenizer, model


@pytest.fixture(scope="module")
def llm(model_dir):
    pytest.importorskip("vllm")
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        # The engine core runs in this process instead of a spawned one.
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        start = time.perf_counter()
        engine = LLM(
            model=str(model_dir),
            dtype="float32",
            max_model_len=256,
            enforce_eager=True,
            seed=0,
            kv_cache_memory_bytes=64 << 20,
        )
        print(f"vLLM engine start: {time.perf_counter() - start:.1f}s")
    yield engine
    del engine
    torch.set_num_threads(threads)  # vLLM lowers it to 1 for serving


def _prompts(tokenizer) -> list[str]:
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": c}], tokenize=False, add_generation_prompt=True
        )
        for c in CONTENTS
    ]


@torch.no_grad()
def _greedy(model, prompt_ids: list[int]) -> tuple[list[int], torch.Tensor]:
    """Reference greedy decoding, EOS ignored: full forward pass per token."""
    ids = list(prompt_ids)
    logps = []
    for _ in range(MAX_NEW):
        logp_v = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1], -1)
        ids.append(int(logp_v.argmax()))
        logps.append(logp_v[ids[-1]])
    return ids[len(prompt_ids) :], torch.stack(logps)


def test_transformers_loads_tokenizer_and_template(hf, model_dir):
    tokenizer, model = hf
    assert model.dtype == torch.float32
    assert model.config.vocab_size == len(tokenizer) == 104
    assert (model_dir / "model.safetensors").exists()
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+2="}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text == "<|system|>be brief<|end|><|user|>1+2=<|end|><|assistant|>"
    assert tokenizer.decode(tokenizer.encode(" a  b\n")) == " a  b\n"
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id == 4
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id == 0


def test_vllm_greedy_matches_transformers(hf, llm):
    from vllm import SamplingParams

    tokenizer, model = hf
    prompts = _prompts(tokenizer)
    # EOS ignored on both sides: always MAX_NEW tokens, compared position by position.
    params = SamplingParams(
        temperature=0, max_tokens=MAX_NEW, logprobs=0, ignore_eos=True, skip_special_tokens=False
    )
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for prompt, out in zip(prompts, outputs):
        prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
        assert list(out.prompt_token_ids) == prompt_ids
        hf_ids, hf_logp = _greedy(model, prompt_ids)
        vllm_ids = list(out.outputs[0].token_ids)
        assert vllm_ids == hf_ids
        assert len(set(vllm_ids)) > 1, "degenerate model output makes the check vacuous"
        vllm_logp = [lp[tok].logprob for lp, tok in zip(out.outputs[0].logprobs, vllm_ids)]
        torch.testing.assert_close(torch.tensor(vllm_logp), hf_logp, atol=1e-4, rtol=0)
        assert out.outputs[0].text == tokenizer.decode(vllm_ids)


def test_vllm_text_skips_special_tokens_like_tokenizer(hf, llm):
    from vllm import SamplingParams

    tokenizer, _ = hf
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)
    for out in llm.generate(_prompts(tokenizer), params, use_tqdm=False):
        ids = list(out.outputs[0].token_ids)
        assert out.outputs[0].text == tokenizer.decode(ids, skip_special_tokens=True)
