"""A rollout replica's process SIGKILLed mid-generation: every request still
gets its result (the dead replica's go to the other one), a new replica with
the same engine config starts, loads the group's current weights before the
router sends it anything, and then samples exactly as the surviving replica."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

ray = pytest.importorskip("ray")
pytest.importorskip("vllm")

from rollout_utils import encode, max_logprob_diff, session_on, two_replicas  # noqa: E402

from rlpost.rollout.base import GenerationRequest, SamplingConfig  # noqa: E402


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    with two_replicas(tmp_path_factory.mktemp("m")) as group_path_tokenizer:
        yield group_path_tokenizer


def test_killed_replica_fails_over_restarts_and_resyncs(setup):
    from transformers import AutoModelForCausalLM

    group, path, tokenizer = setup
    # Weights unlike the checkpoint on disk: a restart that skipped the sync would show.
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(1.7)  # tied: the output head changes too
    group.load_weights([(k, v.clone()) for k, v in model.state_dict().items()])

    victim = group.workers[0]
    pid = ray.get(victim.pid.remote())
    sampling = SamplingConfig(n=4, temperature=1.0, max_tokens=48, seed=3)
    requests = [
        GenerationRequest(encode(tokenizer, f"<|user|>{i}+{i}=<|end|><|assistant|>"), sampling)
        for i in range(32)
    ]
    pending = group.generate_async(requests)  # least in flight: 16 per replica
    while not ray.get(victim.served.remote()):  # replica 0 has its requests
        time.sleep(0.005)
    os.kill(pid, signal.SIGKILL)
    killed = time.perf_counter()

    results = pending.result()
    failover_s = time.perf_counter() - killed
    assert [r.prompt_ids for r in results] == [r.prompt_ids for r in requests]
    assert all(len(r.completions) == 4 and r.completions[0].token_ids for r in results)
    resent = sum(group.router.requests) - len(requests)
    assert resent > 0, "replica 0 had finished before the kill: nothing was failed over"
    assert group.restarts == [1, 0]
    # The new replica is out of the router until it has loaded the current weights.
    assert group.router.healthy == [False, True]

    group.wait_restarts()
    back_s = time.perf_counter() - killed
    print(f"kill -> all {len(requests)} results: {failover_s:.2f}s ({resent} resent); "
          f"kill -> replica back and synced: {back_s:.2f}s")  # fmt: skip
    assert group.router.healthy == [True, True]
    assert ray.get(group.workers[0].pid.remote()) != pid
    assert group.stats()["rollout/replica_restarts"] == 1

    # The same seeded request pinned to each replica: identical samples, and the
    # log-probs of the modified weights (teacher-forced by transformers).
    probe = encode(tokenizer, "<|user|>12+7=<|end|><|assistant|>")
    check = SamplingConfig(n=4, temperature=0.8, max_tokens=8, seed=1)
    on = [GenerationRequest(probe, check, session_id=session_on(group, i)) for i in range(2)]
    restarted, survivor = group.generate(on)
    assert [c.token_ids for c in restarted.completions] == [
        c.token_ids for c in survivor.completions
    ]
    assert max_logprob_diff(model, [restarted], 0.8) < 1e-3
    assert any(sid == on[0].session_id for sid, _ in ray.get(group.workers[0].served.remote()))
