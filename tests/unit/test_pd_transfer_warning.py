"""PD that moves no KV is said, not silent: both spellings of PD configure the
same block size, a run whose prompts are shorter than the connector's blocks is
warned about before Ray starts, and a step whose ``rollout/pd/kv_transfer_rate``
is 0 warns once with the reason (``RolloutGroup.stats``, here without Ray)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from rlpost.config.compose import compose, to_dict
from rlpost.plan.pd_prompts import short_prompts_warning
from rlpost.plan.plan import build_plan
from rlpost.rollout.pd import KVTransferSpec, PDEngineConfig, min_transfer_tokens


def test_pd_enabled_and_the_vllm_pd_preset_are_the_same_config():
    preset, flag = compose(["rollout=vllm_pd"]), compose(["rollout.pd.enabled=true"])
    assert to_dict(preset) == to_dict(flag)
    # vLLM's CPU default block (128) would move nothing below 130 tokens.
    assert flag.rollout.block_size == 32 and flag.rollout.replicas == 2
    assert compose(["rollout.pd.enabled=true", "rollout.block_size=64"]).rollout.block_size == 64
    assert compose([]).rollout.block_size is None  # no PD: vLLM's default


def test_the_shortest_prompt_that_moves_kv():
    # ExampleConnector loads (len - 2) // 32 * 32 tokens: 33 -> 0, 34 -> 32.
    assert min_transfer_tokens(32) == 34
    assert short_prompts_warning(32, [34, 40, 60]) is None
    assert "1 of 2 prompts move" in short_prompts_warning(32, [33, 40])
    # 20-25 tokens: block 16 moves 16 of each (len >= 18), so that is suggested.
    assert "rollout.block_size=16" in short_prompts_warning(32, [20, 25])


def test_the_built_in_tasks_short_prompts_are_warned_about_before_ray_starts(caplog):
    with caplog.at_level(logging.WARNING, logger="rlpost.plan.plan"):
        build_plan(compose(["rollout.pd.enabled=true"]))
    (warning,) = [r.getMessage() for r in caplog.records if "rollout.pd.enabled" in r.getMessage()]
    # The arith prompts are 7-9 tokens with the chat template; 34 are needed.
    assert "none of these prompts moves KV" in warning
    assert "rollout.block_size=32-token blocks" in warning
    assert "needs at least 34 tokens, and these have 7-9 (512 measured)" in warning
    assert "rollout.pd.enabled=false" in warning
    assert "block_size=16" not in warning  # 18 tokens would not be reached either
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rlpost.plan.plan"):
        build_plan(compose([]))
    assert not [r for r in caplog.records if "rollout.pd" in r.getMessage()]


def _group(longest_prompt: int, counters: list[tuple[float, float]]):
    """A PD RolloutGroup (1 prefill + 1 decode replica) whose decode engine
    reports the cumulative (connector queries, connector hits) of ``counters``,
    one pair per stats() call; no Ray actors."""
    pytest.importorskip("ray")
    from rlpost.rollout.router import Router
    from rlpost.serving.pools import Pool
    from rlpost.serving.replica_stats import ReplicaStats
    from rlpost.serving.rollout_group import RolloutGroup

    spec = KVTransferSpec("ExampleConnector", "kv_consumer", "/tmp/kv")
    side = SimpleNamespace(block_size=32, kv_transfer=spec)
    group = RolloutGroup.__new__(RolloutGroup)
    group.pd = PDEngineConfig(side, side, 1, 1)
    group.pools = [Pool("prefill", 0, Router(1)), Pool("decode", 1, Router(1))]
    group.restarts = [0, 0]
    group._stats = ReplicaStats(2, group.pd)
    group.weight_sync_metrics = {}
    group._stats.saw_prompt(longest_prompt)
    calls = iter(counters)

    def call_live(method: str) -> dict:
        queries, hits = next(calls)
        engine = {"prefix_cache_queries": queries, "prefix_cache_hits": 0.0}
        decode = {**engine, "kv_transfer_queries": queries, "kv_transfer_hits": hits}
        return {0: engine, 1: decode}

    group._call_live = call_live
    return group


def test_a_step_that_moves_no_kv_warns_once_with_the_reason(caplog):
    # Three steps of 9-token prompts: 72 prompt tokens computed per step, none loaded.
    group = _group(9, [(72.0, 0.0), (144.0, 0.0), (216.0, 0.0)])
    with caplog.at_level(logging.WARNING, logger="rlpost.serving.replica_stats"):
        rates = [group.stats()["rollout/pd/kv_transfer_rate"] for _ in range(3)]
    assert rates == [0.0, 0.0, 0.0]
    (warning,) = [r.getMessage() for r in caplog.records]  # once, not every step
    assert warning.startswith(
        "rollout/pd/kv_transfer_rate is 0: the decode replicas computed 72 prompt tokens "
        "and loaded none through ExampleConnector"
    )
    assert "needs at least 34 tokens, and the longest one sent has 9" in warning


def test_long_prompts_that_move_no_kv_point_at_the_connector(caplog):
    group = _group(80, [(160.0, 0.0)])
    with caplog.at_level(logging.WARNING, logger="rlpost.serving.replica_stats"):
        group.stats()
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "although prompts of up to 80 tokens (rollout.block_size=32)" in warning
    assert "rollout.pd.shared_dir=/tmp/kv" in warning


def test_a_step_that_moves_kv_warns_nothing(caplog):
    # 160 uncached tokens, 128 from the connector: rate 0.8.
    group = _group(80, [(160.0, 128.0)])
    with caplog.at_level(logging.WARNING, logger="rlpost.serving.replica_stats"):
        assert group.stats()["rollout/pd/kv_transfer_rate"] == pytest.approx(0.8)
    assert not caplog.records
