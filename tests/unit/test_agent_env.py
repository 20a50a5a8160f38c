"""Environments: the default tool environment's answers and done rule, and loading
user environments by spec with errors that say what to change."""

from __future__ import annotations

import asyncio

import pytest

from rlpost.rollout.agent.env import EnvError, ToolEnv, load_env, prompt_messages
from rlpost.rollout.agent.loop import assistant_message
from rlpost.rollout.agent.parsers import parse_hermes

ENV_PY = """
class Counter:
    def __init__(self, limit: int, greeting: str = "hi"):
        self.limit, self.greeting, self.count = limit, greeting, 0

    def reset(self, row):
        return [{"role": "user", "content": self.greeting}]

    async def step(self, message):
        self.count += 1
        return [], self.count >= self.limit, 1.0

class NoStep:
    def reset(self, row):
        return []

def not_a_class():
    pass
"""


def test_prompt_messages_of_a_row():
    assert prompt_messages({"prompt": "2+2="}) == [{"role": "user", "content": "2+2="}]
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert prompt_messages({"prompt": chat}) == chat


def test_tool_env_answers_calls_and_is_done_without_them():
    env = ToolEnv(["calculator"], timeout_s=5)
    assert env.tool_schemas[0]["function"]["name"] == "calculator"
    assert env.reset({"prompt": "6*7?"}) == [{"role": "user", "content": "6*7?"}]
    text = (
        '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
        '<tool_call>{"name": "calculator", "arguments": {"expr": "1"}}</tool_call>'
        "<tool_call>not json</tool_call>"
    )
    message = assistant_message(parse_hermes(text))
    replies, done, reward = asyncio.run(env.step(message))
    assert not done and reward is None
    assert replies[0] == {
        "role": "tool", "name": "calculator", "content": "42", "tool_call_id": "call_0"
    }  # fmt: skip
    assert replies[1]["content"].startswith("Error: bad arguments for calculator: missing")
    assert replies[2]["name"] == "invalid_tool_call"
    assert replies[2]["content"].startswith("Error: tool call is not valid JSON")
    assert [o.status for o in env.outcomes] == ["ok", "error"]
    final = assistant_message(parse_hermes("It is 42."))
    assert asyncio.run(env.step(final)) == ([], True, None)


def test_load_env_builds_fresh_instances(tmp_path):
    path = tmp_path / "envs.py"
    path.write_text(ENV_PY)
    make = load_env(f"{path}:Counter", {"limit": 2})
    first, second = make(), make()
    assert first is not second
    assert first.reset({}) == [{"role": "user", "content": "hi"}]
    assert asyncio.run(first.step({})) == ([], False, 1.0)
    assert asyncio.run(first.step({})) == ([], True, 1.0)
    assert isinstance(load_env("tools", {"tools": ["calculator"]})(), ToolEnv)


def test_load_env_errors(tmp_path):
    path = tmp_path / "envs.py"
    path.write_text(ENV_PY)
    cases = [
        ("nope", {}, "'nope' is not built in \\(\\['tools'\\]\\)"),
        (f"{tmp_path}/missing.py:Counter", {}, "does not exist; fix the path"),
        (f"{path}:Missing", {}, "has no attribute 'Missing'; it defines"),
        (f"{path}:not_a_class", {}, "is a function, not a class"),
        (f"{path}:NoStep", {}, "class NoStep lacks step"),
        (f"{path}:Counter", {"limt": 2}, "Counter\\(limt\\) does not match its constructor"),
        (f"{path}:Counter", {}, "missing a required argument: 'limit'"),
    ]
    for spec, kwargs, message in cases:
        with pytest.raises(EnvError, match=message):
            load_env(spec, kwargs)
