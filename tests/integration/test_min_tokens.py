"""rollout.min_tokens: no end token before that many tokens, on every engine that
runs on the CPU (a benchmark forces long completions with it, the same on every side)."""

from __future__ import annotations

import pytest
import torch

from rlpost.config.compose import compose
from rlpost.config.schema import ConfigError
from rlpost.data.samples import encode_prompt
from rlpost.models.tiny import build_tiny_model
from rlpost.rollout.base import GenerationRequest, SamplingConfig
from rlpost.rollout.registry import build_engine

PROMPTS = ["37+48=", "hello world", "99+1="]
MAX = 24


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # init_std 0.3: at the default 0.02 an untrained model repeats one token.
    return str(build_tiny_model("micro", tmp_path_factory.mktemp("m") / "micro", 0, init_std=0.3))


def _lengths(engine, min_tokens: int) -> list[int]:
    sampling = SamplingConfig(n=16, temperature=1.0, max_tokens=MAX, min_tokens=min_tokens, seed=1)
    requests = [
        GenerationRequest(encode_prompt(engine.tokenizer, {"prompt": p}), sampling) for p in PROMPTS
    ]
    return [len(c.token_ids) for r in engine.generate(requests) for c in r.completions]


def _check(engine) -> None:
    free = _lengths(engine, 0)
    assert min(free) < MAX, "no completion ended early: the check below would be vacuous"
    assert _lengths(engine, MAX) == [MAX] * len(free)
    # At least 12: those that ended early now end at 12 or later.
    assert min(_lengths(engine, 12)) >= 12


def test_hf_min_tokens(model_dir):
    from rlpost.rollout.hf import HFEngineConfig

    _check(build_engine("hf", HFEngineConfig(model_path=model_dir)))


def test_vllm_min_tokens(model_dir):
    pytest.importorskip("vllm")
    from rlpost.rollout.vllm import VLLMEngineConfig

    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        engine = build_engine("vllm", VLLMEngineConfig(model_path=model_dir, kv_cache_gib=0.0625))
    torch.set_num_threads(threads)  # vLLM lowers it to 1 for serving
    _check(engine)
    del engine


def test_min_tokens_above_max_tokens_is_a_config_error():
    with pytest.raises(ConfigError, match=r"rollout.min_tokens=9: must be <= rollout.max_tokens=8"):
        compose(["rollout.min_tokens=9", "rollout.max_tokens=8"])
