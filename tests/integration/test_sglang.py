"""SGLang rollout on a CUDA GPU: the checks the vLLM replicas pass.

- two SGLang replicas behind the router: a multi-turn session stays on one
  replica; greedy outputs of both replicas agree;
- sampling log-probs match a transformers forward (after temperature), before
  and after a weight sync through the group, which reaches every replica;
- release/resume of GPU memory keeps the weights;
- SGLang PD (one prefill and one decode server behind SGLang's router, started
  and stopped by rlpost; needs two GPUs and the Mooncake transfer backend):
  greedy outputs equal a plain SGLang replica's, and a weight sync reaches both
  servers.

Every test carries the ``gpu`` marker (``tests/conftest.py`` skips it where
CUDA is absent); the micro model is built locally, nothing is downloaded.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

ray = pytest.importorskip("ray")

from rollout_utils import max_logprob_diff  # noqa: E402

from rlpost.models.tiny import build_tiny_model  # noqa: E402
from rlpost.rollout.base import GenerationRequest, SamplingConfig  # noqa: E402
from rlpost.serving.rollout_group import RolloutGroup  # noqa: E402

TURNS = 3


def _need_gpus(n: int) -> None:
    if torch.cuda.device_count() < n:
        pytest.skip(f"needs {n} CUDA GPUs")
    pytest.importorskip("sglang")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return str(build_tiny_model("micro", tmp_path_factory.mktemp("m") / "micro", 0, init_std=0.3))


@pytest.fixture(scope="module")
def group(model_path):
    _need_gpus(1)
    from rlpost.rollout.sglang import SGLangEngineConfig

    ray.init(include_dashboard=False, log_to_driver=False)
    # Two replicas share one GPU when there is only one (0.5 GPU each).
    gpus = 1.0 if torch.cuda.device_count() >= 2 else 0.5
    g = RolloutGroup(
        SGLangEngineConfig(model_path=model_path, dtype="float32", max_model_len=256,
                           mem_fraction_static=0.2),
        replicas=2, num_cpus=1, device_opts={"num_gpus": gpus}, engine="sglang",
    )  # fmt: skip
    yield g
    g.close()
    ray.shutdown()


def _prompt(k: int) -> list[int]:
    return [5 + (7 * k + 3 * i) % 90 for i in range(20 + k)]


def test_sessions_stick_and_replicas_agree(group):
    sessions = [f"conv-{k}" for k in range(6)]
    assert {group.router.pick(s) for s in sessions} == {0, 1}
    sampling = SamplingConfig(n=1, temperature=1.0, max_tokens=6, seed=0)
    prompts = {s: _prompt(k) for k, s in enumerate(sessions)}
    for _ in range(TURNS):
        requests = [GenerationRequest(prompts[s], sampling, session_id=s) for s in sessions]
        results = group.generate(requests)
        for s, req, res in zip(sessions, requests, results):
            prompts[s] = req.prompt_ids + res.completions[0].token_ids + [7, 8]
    served = group.served()
    for s in sessions:
        where = [i for i, log in enumerate(served) for sid, _ in log if sid == s]
        assert len(where) == TURNS and len(set(where)) == 1, (s, where)

    greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=8)
    ids = [next(f"g{k}" for k in range(100) if group.router.pick(f"g{k}") == i) for i in range(2)]
    a, b = group.generate([GenerationRequest(_prompt(3), greedy, session_id=s) for s in ids])
    assert a.completions[0].token_ids == b.completions[0].token_ids


def test_logprobs_and_weight_sync(group, model_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    ids = [next(f"w{k}" for k in range(100) if group.router.pick(f"w{k}") == i) for i in range(2)]
    sampling = SamplingConfig(n=4, temperature=0.8, max_tokens=6, seed=1)
    requests = [GenerationRequest(_prompt(5), sampling, session_id=s) for s in ids]
    assert max_logprob_diff(model, group.generate(requests), 0.8) < 1e-3

    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(1.7)
    stale = group.generate(requests)
    assert max_logprob_diff(model, stale, 0.8) > 1e-2
    group.load_weights([(k, v.clone()) for k, v in model.state_dict().items()])
    assert max_logprob_diff(model, group.generate(requests), 0.8) < 1e-3


def test_release_and_resume_memory_keeps_weights(group):
    greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=8)
    before = group.generate([GenerationRequest(_prompt(2), greedy)])
    free_before = torch.cuda.mem_get_info()[0]
    ray.get([w.sleep.remote() for w in group.workers])
    assert torch.cuda.mem_get_info()[0] > free_before  # memory came back to the GPU
    ray.get([w.wake.remote() for w in group.workers])
    after = group.generate([GenerationRequest(_prompt(2), greedy)])
    assert after[0].completions[0].token_ids == before[0].completions[0].token_ids


def test_sglang_pd_matches_a_plain_replica_and_syncs(model_path):
    _need_gpus(3)
    pytest.importorskip("sglang_router")
    pytest.importorskip("mooncake")
    from transformers import AutoModelForCausalLM

    from rlpost.rollout.sglang import SGLangEngineConfig, SGLangPDConfig

    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    pd = RolloutGroup(
        SGLangPDConfig(model_path=model_path, dtype="float32", max_model_len=256,
                       mem_fraction_static=0.2),
        replicas=1, num_cpus=1,
    )  # fmt: skip
    plain = RolloutGroup(
        SGLangEngineConfig(model_path=model_path, dtype="float32", max_model_len=256,
                           mem_fraction_static=0.2),
        replicas=1, num_cpus=1, device_opts={"num_gpus": 1}, engine="sglang",
    )  # fmt: skip
    try:
        greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=8)
        requests = [GenerationRequest(_prompt(k), greedy) for k in range(6)]
        for w, g in zip(plain.generate(requests), pd.generate(requests)):
            assert g.completions[0].token_ids == w.completions[0].token_ids

        model = AutoModelForCausalLM.from_pretrained(model_path).eval()
        with torch.no_grad():
            model.model.embed_tokens.weight.mul_(1.7)
        pd.load_weights([(k, v.clone()) for k, v in model.state_dict().items()])
        sampling = SamplingConfig(n=4, temperature=0.8, max_tokens=6, seed=1)
        fresh = pd.generate([GenerationRequest(_prompt(5), sampling)])
        assert max_logprob_diff(model, fresh, 0.8) < 1e-3
    finally:
        pd.close()
        plain.close()
