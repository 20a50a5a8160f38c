"""An agent written with the OpenAI Agents SDK (``pip install openai-agents``),
trained by rlpost unchanged.

    python -m rlpost.main algo=grpo agent=calculator \\
        agent.program=examples/agents/openai_agents_calculator.py:run

The agent is the SDK's own: an ``Agent`` with a ``function_tool``, run by
``Runner``, which keeps the conversation and calls the tool. The one line that
places it is the model, the SDK's way of pointing at any OpenAI-compatible
server: its Responses model on the episode's client (``POST /v1/responses``).
``OpenAIChatCompletionsModel(model="policy", openai_client=client)`` drives the
same agent through ``POST /v1/chat/completions`` instead. The program returns the
agent's final output: the task's reward (``reward.fn``) scores it.
"""

from __future__ import annotations

import openai
from agents import (
    Agent,
    MaxTurnsExceeded,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)

set_tracing_disabled(True)  # the SDK exports traces to OpenAI's servers unless told not to


@function_tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


async def run(client: openai.AsyncOpenAI, row: dict, max_turns: int = 3) -> str | None:
    model = OpenAIResponsesModel(model="policy", openai_client=client)
    agent = Agent(name="calculator", tools=[multiply], model=model)
    try:
        result = await Runner.run(agent, row["prompt"], max_turns=max_turns)
    except MaxTurnsExceeded:
        return None  # no answer in time: reward.fn scores the last assistant message
    return str(result.final_output)
