"""Agent frameworks driving the endpoint unchanged: the OpenAI Agents SDK's agent
(``examples/agents/openai_agents_calculator.py``) through the Responses and the
Chat Completions routes, streamed or not, captured token for token as the
hand-written programs are; what a framework asks that the endpoint cannot serve
refused naming it and counted; and a program given the episode's URLs and key
(``AgentEndpoint``) running its agent as a process of its own.

The engine is test_agent_endpoint's ``ScriptedEngine``, a small fake that
returns prescribed token ids."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys

import openai
import pytest
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool

from rlpost.models.tiny import build_tokenizer
from rlpost.rollout.agent.loop import episode_metrics
from rlpost.rollout.agent.program import AgentEndpoint, load_program, run_program_episodes
from tests.unit.test_agent_endpoint import CALL, LIMITS, SAMPLING, ids, serve
from tests.unit.test_anthropic_endpoint import check_tool_episode


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@function_tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def episodes(tokenizer, spec, texts, rows=({"prompt": "37*58="},)):
    endpoint, engine = serve(tokenizer, texts)
    out = asyncio.run(
        run_program_episodes(
            list(rows), 1, program=load_program(spec), endpoint=endpoint, tokenizer=tokenizer,
            sampling=SAMPLING, config=LIMITS, session_prefix="fw", timeout_s=60,
        )
    )  # fmt: skip
    endpoint.close()
    return out, engine


async def chat_model_agent(client: openai.AsyncOpenAI, row: dict) -> str:
    """The same agent on the SDK's Chat Completions model, its answer streamed."""
    model = OpenAIChatCompletionsModel(model="policy", openai_client=client)
    agent = Agent(name="calculator", tools=[multiply], model=model)
    streamed = Runner.run_streamed(agent, row["prompt"], max_turns=3)
    async for _ in streamed.stream_events():
        pass
    return str(streamed.final_output)


@pytest.mark.parametrize(
    "spec",
    [
        "examples/agents/openai_agents_calculator.py:run",  # Responses API
        "tests.unit.test_agent_frameworks:chat_model_agent",  # Chat Completions, streamed
    ],
)
def test_an_openai_agents_sdk_agent_is_captured_as_a_hand_written_one(tokenizer, spec):
    (episode,), engine = episodes(tokenizer, spec, [CALL, "2146"])
    check_tool_episode(tokenizer, episode)
    assert (episode.prefix_breaks, episode.refused_requests) == (0, 0)
    assert [r[2] for r in engine.requests] == ["fw-0-0", "fw-0-0"]  # one replica's session


async def penalised_agent(client: openai.AsyncOpenAI, row: dict) -> str:
    """An agent whose settings ask for a frequency penalty the policy cannot apply."""
    model = OpenAIChatCompletionsModel(model="policy", openai_client=client)
    settings = ModelSettings(frequency_penalty=0.5)
    agent = Agent(name="calculator", tools=[multiply], model=model, model_settings=settings)
    return str((await Runner.run(agent, row["prompt"])).final_output)


def test_what_a_framework_asks_that_cannot_be_served_is_refused_naming_it(tokenizer, caplog):
    with caplog.at_level(logging.WARNING, logger="rlpost.rollout.agent.endpoint"):
        (episode,), engine = episodes(
            tokenizer, "tests.unit.test_agent_frameworks:penalised_agent", [CALL, "2146"]
        )
    # the SDK raised the 400 in the program: the episode ends with reward 0, counted
    assert (episode.program, episode.reward, episode.refused_requests) == ("error", 0.0, 1)
    metrics = episode_metrics([episode])
    assert metrics["agent/refused_requests"] == 1.0 and metrics["agent/program_errors"] == 1.0
    assert engine.requests == []  # never sampled as a different request
    (refusal,) = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert "frequency_penalty: not supported by this endpoint" in refusal


def test_parameters_that_ask_for_nothing_are_served_and_a_seed_is_counted(tokenizer):
    endpoint, engine = serve(tokenizer, ["12", "34"])
    session = endpoint.sessions.open("ep-n", 0, SAMPLING, LIMITS)
    client = openai.OpenAI(base_url=endpoint.url, api_key=session.key, max_retries=0)
    user = [{"role": "user", "content": "a"}]
    neutral = dict(frequency_penalty=0, presence_penalty=0, logprobs=False, user="u", store=False,
                   parallel_tool_calls=True, metadata={"k": "v"}, response_format={"type": "text"})  # fmt: skip
    assert client.chat.completions.create(model="m", messages=user, **neutral).choices
    assert session.sampling_overridden == 0
    client.chat.completions.create(model="m", messages=user, seed=3)
    assert session.sampling_overridden == 1  # the run seeds each call: the request's is not used
    with pytest.raises(openai.BadRequestError, match="logit_bias, reasoning_effort: not supported"):
        client.chat.completions.create(
            model="m", messages=user, reasoning_effort="low", logit_bias={"5": 1}
        )
    endpoint.close()
    assert (len(engine.requests), session.refused) == (2, 1)


AGENT_PROCESS = """
import os, openai
client = openai.OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
messages = [{"role": "user", "content": "37*58="}]
reply = client.chat.completions.create(model=os.environ.get("MODEL", "m"), messages=messages)
print(reply.choices[0].message.content)
"""


async def agent_process(endpoint: AgentEndpoint, row: dict) -> str:
    """An agent run as a process of its own, configured by environment variables."""
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", AGENT_PROCESS], env=endpoint.env | {"MODEL": endpoint.model},
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return done.stdout.strip()


def test_a_program_annotated_agent_endpoint_gets_the_urls_and_key(tokenizer):
    program = load_program("tests.unit.test_agent_frameworks:agent_process")
    assert program.api == "endpoint"
    (episode,), engine = episodes(
        tokenizer, "tests.unit.test_agent_frameworks:agent_process", ["2146"]
    )
    assert (episode.program, episode.final_text, episode.num_turns) == ("ok", "2146", 1)
    assert episode.response_ids == [*ids(tokenizer, "2146"), tokenizer.eos_token_id]
    assert [r[2] for r in engine.requests] == ["fw-0-0"]
    place = AgentEndpoint("http://h:1/v1", "http://h:1", "rlp-k", "rlpost-policy")
    assert place.env == {
        "OPENAI_BASE_URL": "http://h:1/v1", "OPENAI_API_KEY": "rlp-k",
        "ANTHROPIC_BASE_URL": "http://h:1", "ANTHROPIC_API_KEY": "rlp-k",
    }  # fmt: skip
