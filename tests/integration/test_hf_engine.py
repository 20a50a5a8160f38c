"""The transformers reference engine: greedy tokens equal vLLM's on the tiny
model, and its sampling log-probs are those of the temperature-scaled
distribution (checked against a teacher-forced forward pass)."""

from __future__ import annotations

import pytest
import torch

from rlpost.data.samples import encode_prompt
from rlpost.models.tiny import build_tiny_model
from rlpost.rollout.base import GenerationRequest, SamplingConfig
from rlpost.rollout.registry import build_engine

PROMPTS = ["37+48=", "hello world", "a b\n c", "99+1="]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # init_std 0.3: at the default 0.02 an untrained model repeats one token.
    return str(build_tiny_model("micro", tmp_path_factory.mktemp("m") / "micro", 0, init_std=0.3))


@pytest.fixture(scope="module")
def hf(model_dir):
    from rlpost.rollout.hf import HFEngineConfig

    return build_engine("hf", HFEngineConfig(model_path=model_dir))


def _requests(engine, sampling: SamplingConfig) -> list[GenerationRequest]:
    return [
        GenerationRequest(encode_prompt(engine.tokenizer, {"prompt": p}), sampling) for p in PROMPTS
    ]


def test_hf_greedy_matches_vllm(hf, model_dir):
    pytest.importorskip("vllm")
    from rlpost.rollout.vllm import VLLMEngineConfig

    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        vllm = build_engine("vllm", VLLMEngineConfig(model_path=model_dir, kv_cache_gib=0.0625))
    torch.set_num_threads(threads)  # vLLM lowers it to 1 for serving
    greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=12)
    requests = _requests(hf, greedy)
    for h, v in zip(hf.generate(requests), vllm.generate(requests)):
        hc, vc = h.completions[0], v.completions[0]
        assert hc.token_ids == vc.token_ids
        assert hc.text == vc.text and hc.finish_reason == vc.finish_reason
        assert len(set(hc.token_ids)) > 1, "degenerate output makes the check vacuous"
        # Greedy log-probs are of the unscaled distribution on both sides.
        torch.testing.assert_close(
            torch.tensor(hc.logprobs), torch.tensor(vc.logprobs), atol=1e-4, rtol=0
        )
    del vllm


@torch.no_grad()
def test_hf_sampling_logprobs_are_the_tempered_distribution(hf):
    temperature = 0.7
    sampling = SamplingConfig(n=4, temperature=temperature, max_tokens=10, seed=3)
    results = hf.generate(_requests(hf, sampling))
    distinct = set()
    for res in results:
        p = len(res.prompt_ids)
        for c in res.completions:
            distinct.add(tuple(c.token_ids))
            ids = torch.tensor([res.prompt_ids + c.token_ids])
            logits_tv = hf.model(ids).logits[0, p - 1 : -1]
            ref_t = torch.log_softmax(logits_tv / temperature, -1).gather(-1, ids[0, p:, None])[
                :, 0
            ]
            torch.testing.assert_close(torch.tensor(c.logprobs), ref_t, atol=1e-4, rtol=0)
            # log-probs of the untempered distribution differ: the check can fail.
            raw_t = torch.log_softmax(logits_tv, -1).gather(-1, ids[0, p:, None])[:, 0]
            assert (raw_t - ref_t).abs().max() > 1e-2
    assert len(distinct) > len(PROMPTS)  # samples of one prompt differ
    # Same seed, same samples.
    again = hf.generate(_requests(hf, sampling))
    assert [c.token_ids for r in again for c in r.completions] == [
        c.token_ids for r in results for c in r.completions
    ]
