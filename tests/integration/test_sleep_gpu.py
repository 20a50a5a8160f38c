"""vLLM's sleep mode as the colocated schedule uses it (``rlpost.loop.memory``),
on a CUDA GPU: level 2 frees the device memory, the weights wake first and a
weight load writes them, the KV cache wakes after, and greedy generation is what
it was before the sleep. Skipped where no GPU is present (it needs one)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("vllm")

from rlpost.models.tiny import build_tiny_model  # noqa: E402
from rlpost.rollout.base import GenerationRequest, SamplingConfig  # noqa: E402


@pytest.mark.gpu
def test_sleep_frees_memory_and_a_woken_engine_generates_as_before(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from rlpost.rollout.vllm import VLLMEngineConfig
    from rlpost.rollout.vllm.engine import VLLMEngine

    path = build_tiny_model("tiny", tmp_path / "m", seed=0)
    cfg = VLLMEngineConfig(
        model_path=str(path), kv_cache_gib=0.25, device="cuda", sleep_mode=True,
        gpu_memory_utilization=0.2,
    )  # fmt: skip
    engine = VLLMEngine(cfg)
    greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=16)
    prompt = [5, 6, 7, 8, 9]
    before = engine.generate([GenerationRequest(prompt, greedy)])[0].completions[0].token_ids
    weights = list(AutoModelForCausalLM.from_pretrained(path).state_dict().items())

    async def schedule() -> tuple[int, int]:
        free_awake, _ = torch.cuda.mem_get_info()
        await engine.asleep(2)
        free_asleep, _ = torch.cuda.mem_get_info()
        await engine.awake(["weights"])
        engine.load_weights(weights)  # level 2 dropped them: the sync writes them
        await engine.awake(["kv_cache"])
        return free_awake, free_asleep

    free_awake, free_asleep = asyncio.run(schedule())
    assert free_asleep > free_awake  # the KV cache and the weights were released
    after = engine.generate([GenerationRequest(prompt, greedy)])[0].completions[0].token_ids
    assert after == before
