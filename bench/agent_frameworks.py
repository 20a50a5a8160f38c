"""Agent frameworks on the agent endpoint, unchanged: which ones run, through which
route, and whether their tokens are captured exactly.

    pip install openai-agents langchain-openai 'pydantic-ai-slim[openai]' litellm smolagents
    python bench/agent_frameworks.py

Each framework runs the calculator task's agent (a multiply tool; "37*58=") as an
agent program (``agent.program``), configured the way that framework is pointed
at any OpenAI- or Anthropic-compatible server: these functions are what
docs/agents.md shows. A framework that is not installed is reported as such.

The policy behind the endpoint is a scripted fake (``ScriptedPolicy``): its first
call samples the tool call, its second the answer, so the check is the
framework's requests and the endpoint's capture, not a model's skill. Per
framework: the episode's status, its model calls, whether the trained mask is
exactly the sampled tokens (1) and the tool turn between them (0), and what the
endpoint refused (``agent/refused_requests``, with the parameter named).

Writes bench/results/agent_frameworks.md and .json.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))

from rlpost.models.tiny import build_tokenizer  # noqa: E402
from rlpost.rollout.agent.endpoint import ChatEndpoint  # noqa: E402
from rlpost.rollout.agent.loop import AgentLoopConfig  # noqa: E402
from rlpost.rollout.agent.program import (  # noqa: E402
    AgentEndpoint,
    Program,
    client_api,
    run_program_episodes,
)
from rlpost.rollout.base import Completion, SamplingConfig  # noqa: E402

CALL = '<tool_call>{"name":"multiply","arguments":{"a":37,"b":58}}</tool_call>'
SCRIPT = [CALL, "2146"]


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


# -- the agents, one per framework, as docs/agents.md shows them ----------------
async def openai_agents_responses(client, row):
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    model = OpenAIResponsesModel(model="policy", openai_client=client)
    agent = Agent(name="calculator", tools=[function_tool(multiply)], model=model)
    return (await Runner.run(agent, row["prompt"], max_turns=3)).final_output


async def openai_agents_chat(client, row):
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    model = OpenAIChatCompletionsModel(model="policy", openai_client=client)
    agent = Agent(name="calculator", tools=[function_tool(multiply)], model=model)
    return (await Runner.run(agent, row["prompt"], max_turns=3)).final_output


async def langchain(endpoint: AgentEndpoint, row):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=endpoint.model, base_url=endpoint.base_url, api_key=endpoint.api_key)
    llm = llm.bind_tools([tool(multiply)])
    messages = [HumanMessage(row["prompt"])]
    for _ in range(3):
        reply = await llm.ainvoke(messages)
        messages.append(reply)
        if not reply.tool_calls:
            return reply.content
        for call in reply.tool_calls:
            messages.append(ToolMessage(str(multiply(**call["args"])), tool_call_id=call["id"]))
    return None


async def pydantic_ai_chat(endpoint: AgentEndpoint, row):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url=endpoint.base_url, api_key=endpoint.api_key)
    agent = Agent(OpenAIChatModel(endpoint.model, provider=provider), tools=[multiply])
    return (await agent.run(row["prompt"])).output


async def pydantic_ai_responses(endpoint: AgentEndpoint, row):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url=endpoint.base_url, api_key=endpoint.api_key)
    agent = Agent(OpenAIResponsesModel(endpoint.model, provider=provider), tools=[multiply])
    return (await agent.run(row["prompt"])).output


TOOLS = [{"type": "function", "function": {
    "name": "multiply", "description": "Multiply two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                    "b": {"type": "integer"}}},
}}]  # fmt: skip


async def litellm_openai(endpoint: AgentEndpoint, row):
    import litellm

    messages = [{"role": "user", "content": row["prompt"]}]
    for _ in range(3):
        reply = await litellm.acompletion(
            model=f"openai/{endpoint.model}", api_base=endpoint.base_url,
            api_key=endpoint.api_key, messages=messages, tools=TOOLS,
        )  # fmt: skip
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content
        for call in message.tool_calls:
            result = multiply(**json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})
    return None


async def litellm_anthropic(endpoint: AgentEndpoint, row):
    import litellm

    reply = await litellm.acompletion(
        model="anthropic/policy", api_base=endpoint.anthropic_base_url,
        api_key=endpoint.api_key, messages=[{"role": "user", "content": row["prompt"]}],
        max_tokens=64,
    )  # fmt: skip
    return reply.choices[0].message.content


def smolagents_tool_calling(endpoint: AgentEndpoint, row):
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    model = OpenAIServerModel(model_id=endpoint.model, api_base=endpoint.base_url,
                              api_key=endpoint.api_key)  # fmt: skip
    return ToolCallingAgent(tools=[tool(multiply)], model=model, max_steps=3).run(row["prompt"])


# (name, package whose version is reported, route, agent, the scripted replies)
FRAMEWORKS: list[tuple[str, str, str, Callable, list[str]]] = [
    ("OpenAI Agents SDK, OpenAIResponsesModel", "openai-agents", "responses",
     openai_agents_responses, SCRIPT),
    ("OpenAI Agents SDK, OpenAIChatCompletionsModel", "openai-agents", "chat",
     openai_agents_chat, SCRIPT),
    ("LangChain, ChatOpenAI.bind_tools", "langchain-openai", "chat", langchain, SCRIPT),
    ("Pydantic AI, OpenAIChatModel", "pydantic-ai-slim", "chat", pydantic_ai_chat, SCRIPT),
    ("Pydantic AI, OpenAIResponsesModel", "pydantic-ai-slim", "responses",
     pydantic_ai_responses, SCRIPT),
    ("LiteLLM, openai/ provider", "litellm", "chat", litellm_openai, SCRIPT),
    ("LiteLLM, anthropic/ provider", "litellm", "messages", litellm_anthropic, ["2146"]),
    ("smolagents, ToolCallingAgent", "smolagents", "chat", smolagents_tool_calling, SCRIPT),
]  # fmt: skip


class ScriptedPolicy:
    """A fake policy: each call samples the next scripted text and its end token, at
    log-prob -0.5 a token."""

    def __init__(self, tokenizer, texts: list[str]):
        self.tokenizer, self.texts = tokenizer, list(texts)

    async def __call__(self, prompt_ids, sampling, session_id) -> Completion:
        text = self.texts.pop(0) if self.texts else "2146"
        ids = [*self.tokenizer(text, add_special_tokens=False)["input_ids"],
               self.tokenizer.eos_token_id]  # fmt: skip
        return Completion(ids, [-0.5] * len(ids), "", "stop", versions=[0] * len(ids))


def check(tokenizer, name: str, agent: Callable, script: list[str]) -> dict:
    endpoint = ChatEndpoint(ScriptedPolicy(tokenizer, script), tokenizer).start()
    program = Program(agent, name, inspect.iscoroutinefunction(agent), client_api(agent))
    refusals: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: refusals.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("rlpost.rollout.agent.endpoint").addHandler(handler)
    try:
        (episode,) = asyncio.run(
            run_program_episodes(
                [{"prompt": "37*58="}], 1, program=program, endpoint=endpoint,
                tokenizer=tokenizer, sampling=SamplingConfig(temperature=1.0, max_tokens=100),
                config=AgentLoopConfig(max_turns=3, max_response_tokens=200, max_model_len=4096),
                session_prefix="fw", timeout_s=120,
            )
        )  # fmt: skip
    finally:
        logging.getLogger("rlpost.rollout.agent.endpoint").removeHandler(handler)
        endpoint.close()
    sampled = [t.sampled_ids for t in episode.turns]
    exact = [i for i, m in zip(episode.response_ids, episode.response_mask, strict=True) if m]
    return {
        "status": episode.program,
        "calls": episode.num_turns,
        "answer": episode.final_text,
        # the trained tokens are the sampled ones, when there are any
        "mask_exact": bool(sampled) and exact == [i for ids in sampled for i in ids],
        "refused": episode.refused_requests,
        "refusal": next((r.split("error): ", 1)[-1] for r in refusals if "refused" in r), ""),
    }


def main() -> None:
    tokenizer = build_tokenizer()
    rows = []
    for name, package, route, agent, script in FRAMEWORKS:
        try:
            version = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            rows.append({"framework": name, "package": package, "version": None, "route": route})
            print(f"{name}: {package} not installed")
            continue
        row = {"framework": name, "package": package, "version": version, "route": route,
               **check(tokenizer, name, agent, script)}  # fmt: skip
        rows.append(row)
        print(f"{name} ({package} {version}): {row['status']}, {row['calls']} calls, "
              f"mask exact {row['mask_exact']}, refused {row['refused']} {row['refusal']}")  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "agent_frameworks.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = [
        "# Agent frameworks on the agent endpoint",
        "",
        "`python bench/agent_frameworks.py`: each framework's calculator agent as an agent "
        "program, against a scripted policy (tool call, then the answer).",
        "",
        "| framework | version | route | episode | model calls | mask exact | refused |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["version"] is None:
            lines.append(f"| {r['framework']} | not installed | {r['route']} | | | | |")
            continue
        refused = f"{r['refused']}: {r['refusal']}" if r["refused"] else "0"
        exact = r["mask_exact"] if r["calls"] else "(no calls)"
        lines.append(f"| {r['framework']} | {r['version']} | {r['route']} | {r['status']} "
                     f"| {r['calls']} | {exact} | {refused} |")  # fmt: skip
    (RESULTS / "agent_frameworks.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {RESULTS / 'agent_frameworks.md'}")


if __name__ == "__main__":
    main()
