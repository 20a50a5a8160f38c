"""Many seeded requests with long prompts at once (a step of multi-turn episodes):
vLLM's CPU backend failed when a seeded prefill was split over engine steps."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from rlpost.models.tiny import build_tiny_model  # noqa: E402
from rlpost.rollout.base import GenerationRequest, SamplingConfig  # noqa: E402


def test_seeded_long_prompts_in_one_batch_are_reproducible(tmp_path):
    from rlpost.rollout.vllm import VLLMEngineConfig
    from rlpost.rollout.vllm.engine import VLLMEngine

    model = build_tiny_model("micro", tmp_path / "m", seed=0)
    engine = VLLMEngine(
        VLLMEngineConfig(model_path=str(model), max_model_len=256, kv_cache_gib=1.0)
    )
    # 128 prompts x 150 tokens = 19,200 prompt tokens: several engine steps' worth
    prompts = [[5 + (j * 7 + i) % 90 for j in range(150)] for i in range(128)]
    requests = [
        GenerationRequest(p, SamplingConfig(n=1, max_tokens=6, seed=1000 + i))
        for i, p in enumerate(prompts)
    ]
    first = engine.generate(requests)
    again = engine.generate(requests[:4])  # same seed, alone: the same samples
    assert len(first) == 128 and all(len(r.completions[0].token_ids) > 0 for r in first)
    for a, b in zip(first[:4], again):
        assert a.completions[0].token_ids == b.completions[0].token_ids
