"""The endpoint's Anthropic Messages API (``POST /v1/messages``) through the real
``anthropic`` client over HTTP: a tool round trip captured token for token as the
chat-completions path captures it, streaming as Anthropic's events, stop
sequences, and requests it cannot serve refused with Anthropic's error body.

The engine behind it is test_agent_endpoint's ``ScriptedEngine``, a small fake
that returns prescribed token ids."""

from __future__ import annotations

import asyncio

import anthropic
import httpx
import pytest

from rlpost.models.tiny import build_tokenizer
from rlpost.rollout.agent.capture import segments
from tests.unit.test_agent_endpoint import CALL, LIMITS, SAMPLING, ids, serve

MULTIPLY = {
    "name": "multiply",
    "description": "a times b",
    "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
}


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def base_url(endpoint) -> str:
    return endpoint.url.removesuffix("/v1")  # the SDK adds /v1/messages


def test_a_tool_round_trip_is_captured_as_the_chat_path_captures_it(tokenizer):
    endpoint, engine = serve(tokenizer, [CALL, "2146"])
    session = endpoint.sessions.open("ep-a", 0, SAMPLING, LIMITS)

    async def agent():
        client = anthropic.AsyncAnthropic(base_url=base_url(endpoint), api_key=session.key)
        messages = [{"role": "user", "content": "37*58="}]
        first = await client.messages.create(
            model="m", max_tokens=100, messages=messages, tools=[MULTIPLY]
        )
        assert first.stop_reason == "tool_use"
        (use,) = first.content  # no text before the call: a tool_use block alone
        assert (use.type, use.name, use.input) == ("tool_use", "multiply", {"a": 37, "b": 58})
        messages.append({"role": "assistant", "content": [b.model_dump() for b in first.content]})
        messages.append({
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "2146"}],
        })  # fmt: skip
        second = await client.messages.create(
            model="m", max_tokens=100, messages=messages, tools=[MULTIPLY]
        )
        await client.close()
        return second

    second = asyncio.run(agent())
    endpoint.close()
    assert [(b.type, b.text) for b in second.content] == [("text", "2146")]
    assert second.stop_reason == "end_turn" and second.usage.output_tokens == 5
    first, last = session.calls
    # the tool result is the template's tool turn, appended to what was sampled
    delta = ids(tokenizer, "<|tool|>2146<|end|><|assistant|>")
    assert first.prompt_ids == ids(tokenizer, "<|user|>37*58=<|end|><|assistant|>")
    assert last.prompt_ids == first.prompt_ids + first.sampled_ids + delta
    (segment,) = segments(session.calls)
    assert segment.mask == [1] * len(first.sampled_ids) + [0] * len(delta) + [1] * 5
    assert [r[2] for r in engine.requests] == ["ep-a", "ep-a"]


def test_system_streaming_and_stop_sequences(tokenizer):
    endpoint, _ = serve(tokenizer, ["12345", "678"])
    session = endpoint.sessions.open("ep-b", 1, SAMPLING, LIMITS)
    client = anthropic.Anthropic(base_url=base_url(endpoint), api_key=session.key, max_retries=0)
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}]}]
    reply = client.messages.create(
        model="m", max_tokens=50, system="be brief", messages=messages, stop_sequences=["34"]
    )
    assert [b.text for b in reply.content] == ["12"]
    assert (reply.stop_reason, reply.stop_sequence) == ("stop_sequence", "34")
    first = session.calls[0]
    assert first.prompt_ids == ids(
        tokenizer, "<|system|>be brief<|end|><|user|>a<|end|><|assistant|>"
    )
    messages += [{"role": "assistant", "content": "12"}, {"role": "user", "content": "b"}]
    with client.messages.stream(
        model="m", max_tokens=50, system="be brief", messages=messages
    ) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    endpoint.close()
    assert text == "678" and final.stop_reason == "end_turn" and final.usage.output_tokens == 4
    assert len(segments(session.calls)) == 1  # the second call continued the first


def test_what_the_endpoint_cannot_serve_is_refused_naming_it(tokenizer):
    endpoint, engine = serve(tokenizer, [])
    session = endpoint.sessions.open("ep-c", 2, SAMPLING, LIMITS)
    client = anthropic.Anthropic(base_url=base_url(endpoint), api_key=session.key, max_retries=0)
    user = [{"role": "user", "content": "a"}]
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
    }
    cases = [
        (dict(messages=user, extra_body={"top_k": 5}), "top_k"),
        (
            dict(messages=user, tools=[MULTIPLY], tool_choice={"type": "any"}),
            "tool_choice={'type': 'any'}",
        ),
        (dict(messages=[{"role": "user", "content": [image]}]), "type 'image'"),
        (dict(messages=user, thinking={"type": "enabled", "budget_tokens": 1024}), "thinking"),
        (dict(messages=[]), "'messages' must be a non-empty list"),
    ]
    for kwargs, named in cases:
        with pytest.raises(anthropic.BadRequestError) as info:
            client.messages.create(model="m", max_tokens=10, **kwargs)
        error = info.value.body["error"]
        assert info.value.status_code == 400 and error["type"] == "invalid_request_error"
        assert named in error["message"], (kwargs, error)
    stranger = anthropic.Anthropic(base_url=base_url(endpoint), api_key="guessed", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        stranger.messages.create(model="m", max_tokens=10, messages=user)
    # Anthropic's own header for the key is accepted as well
    raw = httpx.post(f"{endpoint.url}/messages", headers={"x-api-key": session.key},
                     json={"model": "m", "messages": user})  # fmt: skip
    assert raw.status_code == 400 and "max_tokens" in raw.json()["error"]["message"]
    endpoint.close()
    assert engine.requests == []


def test_a_program_annotated_with_anthropics_client_is_given_it(tokenizer):
    from rlpost.rollout.agent.program import load_program, run_program_episodes

    program = load_program("examples/agents/anthropic_calculator.py:run")
    assert (program.api, program.is_async) == ("anthropic", True)
    assert load_program("examples/agents/openai_calculator.py:run").api == "openai"
    endpoint, engine = serve(tokenizer, [CALL, "2146"])
    (episode,) = asyncio.run(
        run_program_episodes(
            [{"prompt": "37*58="}], 1, program=program, endpoint=endpoint, tokenizer=tokenizer,
            sampling=SAMPLING, config=LIMITS, session_prefix="an", timeout_s=60,
        )
    )  # fmt: skip
    endpoint.close()
    check_tool_episode(tokenizer, episode)
    assert [r[2] for r in engine.requests] == ["an-0-0", "an-0-0"]


def check_tool_episode(tokenizer, episode):
    """The calc task's tool round trip captured: the call sampled, the tool turn
    between (not trained), the answer sampled; one episode of two model turns."""
    assert (episode.program, episode.num_turns, episode.final_text) == ("ok", 2, "2146")
    delta = ids(tokenizer, "<|tool|>2146<|end|><|assistant|>")
    call = [*ids(tokenizer, CALL), tokenizer.eos_token_id]
    assert episode.prompt_ids == ids(tokenizer, "<|user|>37*58=<|end|><|assistant|>")
    assert episode.response_ids == call + delta + [*ids(tokenizer, "2146"), tokenizer.eos_token_id]
    assert episode.response_mask == [1] * len(call) + [0] * len(delta) + [1] * 5
    assert episode.logprobs == [-0.5] * len(call) + [0.0] * len(delta) + [-0.5] * 5
