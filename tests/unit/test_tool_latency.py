"""``agent.tool_latency_s``: a turn that calls tools waits a seeded uniform delay
first (a slow tool, for benchmarks); a turn without calls does not."""

from __future__ import annotations

import asyncio
import random
import time

from rlpost.rollout.agent.env import ToolEnv

CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"function": {"name": "calculator", "arguments": {"expression": "6*7"}}}],
}


def test_a_tool_turn_waits_its_seeded_delay_and_an_answer_does_not():
    async def episode(env: ToolEnv) -> tuple[float, float, list]:
        env.reset({"prompt": "6*7="})
        start = time.perf_counter()
        replies, done, _ = await env.step(CALL)
        called = time.perf_counter() - start
        start = time.perf_counter()
        _, answered, _ = await env.step({"role": "assistant", "content": "42"})
        assert answered and not done
        return called, time.perf_counter() - start, replies

    env = ToolEnv(["calculator"], latency_s=(0.2, 0.3), seed=5)
    called, answered, replies = asyncio.run(episode(env))
    delay = random.Random(5).uniform(0.2, 0.3)  # the first draw of seed 5
    assert delay <= called < delay + 0.5, (called, delay)
    assert answered < 0.1
    assert replies[0]["content"] == "42"
    fast, _, _ = asyncio.run(episode(ToolEnv(["calculator"])))
    assert fast < 0.2
