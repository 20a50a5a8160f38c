"""PD pieces without engines: the prefill half of a request, the two routers,
the KV-directory cleanup and the config derivation."""

from __future__ import annotations

import pytest

from rlpost.config.compose import compose
from rlpost.config.schema import ConfigError
from rlpost.rollout.base import GenerationRequest, SamplingConfig
from rlpost.rollout.pd import KVTransferSpec, PDRouter, clear_kv_store, prefill_request


def test_prefill_request_keeps_the_prompt_and_asks_one_greedy_token():
    req = GenerationRequest([5, 6, 7], SamplingConfig(n=8, temperature=0.7, max_tokens=64), "s1")
    pre = prefill_request(req)
    # The connector keys KV by the prompt's token ids: they must be identical.
    assert pre.prompt_ids == [5, 6, 7] and pre.session_id == "s1"
    assert (pre.sampling.n, pre.sampling.max_tokens, pre.sampling.temperature) == (1, 1, 0.0)


def test_sessions_stick_in_both_pools_and_others_spread():
    router = PDRouter(prefill_replicas=2, decode_replicas=3)
    picks = {s: router.pick(s) for s in (f"c{k}" for k in range(40))}
    assert all(router.pick(s) == p for s, p in picks.items())  # deterministic
    assert {d for _, d in picks.values()} == {0, 1, 2}
    # Independent requests: least in flight, lowest index first, in each pool.
    router.prefill.begin(0)
    router.decode.begin(0)
    assert router.pick() == (1, 1)


def test_clear_kv_store_empties_only_file_connector_dirs(tmp_path):
    (tmp_path / "abc").mkdir()
    (tmp_path / "abc" / "layer.safetensors").write_bytes(b"x")
    clear_kv_store(KVTransferSpec("NixlConnector", "kv_producer", str(tmp_path)))
    assert (tmp_path / "abc").exists()  # not a file connector: nothing to clear
    clear_kv_store(KVTransferSpec("ExampleConnector", "kv_producer", str(tmp_path)))
    assert list(tmp_path.iterdir()) == []


def test_pd_replicas_are_derived_and_checked():
    cfg = compose(["rollout.pd.enabled=true", "rollout.pd.decode_replicas=2"])
    assert cfg.rollout.replicas == 3  # 1 prefill + 2 decode
    with pytest.raises(ConfigError, match="prefill_replicas \\+ rollout.pd.decode_replicas = 3"):
        compose(
            [
                "rollout.pd.enabled=true",
                "rollout.pd.decode_replicas=2",
                "rollout.replicas=2",
            ]
        )
    with pytest.raises(ConfigError, match="rollout.name=hf has no KV transfer"):
        compose(["rollout.pd.enabled=true", "rollout.name=hf"])
