"""The endpoint's OpenAI Responses API (``POST /v1/responses``) through the real
``openai`` client over HTTP: a tool round trip by ``previous_response_id`` and by
the whole input, each captured token for token as the chat path captures it,
streaming as the Responses events, and what it cannot serve refused naming it.

The engine behind it is test_agent_endpoint's ``ScriptedEngine``, a small fake
that returns prescribed token ids."""

from __future__ import annotations

import json

import openai
import pytest

from rlpost.models.tiny import build_tokenizer
from rlpost.rollout.agent.capture import segments
from tests.unit.test_agent_endpoint import CALL, LIMITS, SAMPLING, ids, serve

MULTIPLY = {"type": "function", "name": "multiply", "parameters": {"type": "object"}}


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def check_round_trip(tokenizer, session, second):
    assert second.output_text == "2146" and second.status == "completed"
    assert second.usage.output_tokens == 5
    first, last = session.calls
    delta = ids(tokenizer, "<|tool|>2146<|end|><|assistant|>")
    assert first.prompt_ids == ids(
        tokenizer, "<|system|>be brief<|end|><|user|>37*58=<|end|><|assistant|>"
    )
    assert last.prompt_ids == first.prompt_ids + first.sampled_ids + delta
    (segment,) = segments(session.calls)
    assert segment.mask == [1] * len(first.sampled_ids) + [0] * len(delta) + [1] * 5


@pytest.mark.parametrize("continued", ["previous_response_id", "whole_input"])
def test_a_tool_round_trip_is_captured_as_the_chat_path_captures_it(tokenizer, continued):
    endpoint, _ = serve(tokenizer, [CALL, "2146"])
    session = endpoint.sessions.open("ep-r", 0, SAMPLING, LIMITS)
    client = openai.OpenAI(base_url=endpoint.url, api_key=session.key, max_retries=0)
    asked = dict(model="m", instructions="be brief", tools=[MULTIPLY])
    first = client.responses.create(input="37*58=", **asked)
    (call,) = first.output
    assert (call.type, call.name, json.loads(call.arguments)) == (
        "function_call",
        "multiply",
        {"a": 37, "b": 58},
    )
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "2146"}
    if continued == "previous_response_id":
        second = client.responses.create(input=[result], previous_response_id=first.id, **asked)
    else:  # the agent keeps the conversation itself and sends it whole
        history = [{"role": "user", "content": "37*58="}, call.model_dump(exclude_none=True)]
        second = client.responses.create(input=[*history, result], **asked)
    endpoint.close()
    check_round_trip(tokenizer, session, second)


def test_streaming_and_a_response_cut_at_max_output_tokens(tokenizer):
    endpoint, _ = serve(tokenizer, ["678", "abcdef..."])
    session = endpoint.sessions.open("ep-s", 1, SAMPLING, LIMITS)
    client = openai.OpenAI(base_url=endpoint.url, api_key=session.key, max_retries=0)
    events = list(client.responses.create(model="m", input="a", stream=True))
    assert [e.type for e in events][0] == "response.created"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "678" and events[-1].type == "response.completed"
    assert events[-1].response.output_text == "678"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    cut = client.responses.create(
        model="m", input=[{"role": "user", "content": [{"type": "input_text", "text": "b"}]}],
        max_output_tokens=3,
    )  # fmt: skip
    endpoint.close()
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 3


def test_what_the_endpoint_cannot_serve_is_refused_naming_it(tokenizer):
    endpoint, engine = serve(tokenizer, [])
    session = endpoint.sessions.open("ep-t", 2, SAMPLING, LIMITS)
    client = openai.OpenAI(base_url=endpoint.url, api_key=session.key, max_retries=0)
    image = {"type": "input_image", "image_url": "data:image/png;base64,AA=="}
    cases = [
        (dict(input="a", reasoning={"effort": "low"}), "reasoning"),
        (dict(input="a", tools=[{"type": "web_search"}]), "type 'web_search'"),
        (dict(input="a", tools=[MULTIPLY], tool_choice="required"), "tool_choice='required'"),
        (dict(input=[{"role": "user", "content": [image]}]), "type 'input_image'"),
        (dict(input="a", previous_response_id="resp_other"), "no such response in this episode"),
        (dict(input=[{"type": "reasoning", "summary": []}]), "type 'reasoning'"),
    ]
    for kwargs, named in cases:
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(model="m", **kwargs)
        assert info.value.status_code == 400 and named in info.value.body["message"], kwargs
    endpoint.close()
    assert engine.requests == []
