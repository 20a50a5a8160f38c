"""An agent program for the CLI test: each row names the route its episode takes --
OpenAI's Chat Completions, OpenAI's Responses, Anthropic's Messages, or the OpenAI
Agents SDK's Runner over Chat Completions (its Responses model raises on a reply
cut at its token limit, which a random model's replies are) -- and the episode is
a tool round trip through it. The program is given the episode's URLs and key
(``AgentEndpoint``) and builds each client the way its SDK is pointed at any
compatible server. Each episode's sampled token counts (as each API reports its
usage) go to the file in RLPOST_TEST_TOKENS, one JSON line each."""

from __future__ import annotations

import json
import os

import anthropic
import openai

from rlpost.rollout.agent import AgentEndpoint

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
RESULT = "42"


def openai_client(endpoint: AgentEndpoint) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key)


async def chat(endpoint: AgentEndpoint, question: str) -> list[int]:
    tool = {"type": "function", "function": {"name": "multiply", "parameters": SCHEMA}}
    messages: list[dict] = [{"role": "user", "content": question}]
    async with openai_client(endpoint) as client:
        first = await client.chat.completions.create(
            model=endpoint.model, messages=messages, tools=[tool], max_tokens=12
        )
        messages.append(first.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": "call_0", "content": RESULT})
        second = await client.chat.completions.create(
            model=endpoint.model, messages=messages, max_tokens=12
        )
    return [first.usage.completion_tokens, second.usage.completion_tokens]


async def responses(endpoint: AgentEndpoint, question: str) -> list[int]:
    tool = {"type": "function", "name": "multiply", "parameters": SCHEMA}
    async with openai_client(endpoint) as client:
        first = await client.responses.create(
            model=endpoint.model, input=question, tools=[tool], max_output_tokens=12
        )
        # the tool's result as an input message: the model's text need not be a call
        second = await client.responses.create(
            model=endpoint.model, previous_response_id=first.id, max_output_tokens=12,
            input=[{"role": "user", "content": f"the tool says {RESULT}"}],
        )  # fmt: skip
    return [first.usage.output_tokens, second.usage.output_tokens]


async def messages(endpoint: AgentEndpoint, question: str) -> list[int]:
    tool = {"name": "multiply", "input_schema": SCHEMA}
    history: list[dict] = [{"role": "user", "content": question}]
    async with anthropic.AsyncAnthropic(
        base_url=endpoint.anthropic_base_url, api_key=endpoint.api_key
    ) as client:
        first = await client.messages.create(
            model=endpoint.model, max_tokens=12, messages=history, tools=[tool]
        )
        history.append({"role": "assistant", "content": [b.model_dump() for b in first.content]})
        uses = [b for b in first.content if b.type == "tool_use"]
        results = [{"type": "tool_result", "tool_use_id": b.id, "content": RESULT} for b in uses]
        history.append({"role": "user", "content": results or f"the tool says {RESULT}"})
        second = await client.messages.create(model=endpoint.model, max_tokens=12, messages=history)
    return [first.usage.output_tokens, second.usage.output_tokens]


async def agents_sdk(endpoint: AgentEndpoint, question: str) -> list[int]:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)

    @function_tool
    def multiply(a: int) -> int:
        """Multiply by two."""
        return 2 * a

    async with openai_client(endpoint) as client:
        model = OpenAIChatCompletionsModel(model=endpoint.model, openai_client=client)
        agent = Agent(name="calc", tools=[multiply], model=model,
                      model_settings=ModelSettings(max_tokens=12))  # fmt: skip
        result = await Runner.run(agent, question, max_turns=3)
    return [r.usage.output_tokens for r in result.raw_responses]


ROUTES = {"chat": chat, "responses": responses, "messages": messages, "agents": agents_sdk}


async def run(endpoint: AgentEndpoint, row: dict) -> float:
    tokens = await ROUTES[row["route"]](endpoint, row["question"])
    with open(os.environ["RLPOST_TEST_TOKENS"], "a") as f:
        f.write(json.dumps({"split": row["split"], "route": row["route"], "tokens": tokens}) + "\n")
    return 1.0 if len(tokens) > 1 else 0.0
