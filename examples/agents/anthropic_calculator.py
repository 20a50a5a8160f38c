"""An agent written against Anthropic's Messages API, trained by rlpost unchanged.

    python -m rlpost.main algo=grpo agent=calculator \\
        agent.program=examples/agents/anthropic_calculator.py:run

The ``client`` parameter's annotation asks for Anthropic's client: rlpost calls
``run(client, row)`` once per episode with an ``anthropic.AsyncAnthropic`` bound
to that episode's session on its endpoint (``POST /v1/messages``). The program
keeps the conversation, runs the tool itself and returns None: the task's reward
(``reward.fn``) then scores the last answer.
"""

from __future__ import annotations

import anthropic

MULTIPLY = {
    "name": "multiply",
    "description": "Multiply two integers.",
    "input_schema": {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "description": "The first factor."},
            "b": {"type": "integer", "description": "The second factor."},
        },
        "required": ["a", "b"],
    },
}


def multiply(a: int, b: int) -> int:
    return a * b


async def run(client: anthropic.AsyncAnthropic, row: dict, max_turns: int = 3) -> None:
    messages: list[dict] = [{"role": "user", "content": row["prompt"]}]
    for _ in range(max_turns):
        reply = await client.messages.create(
            model="policy", max_tokens=128, messages=messages, tools=[MULTIPLY]
        )
        messages.append({"role": "assistant", "content": [b.model_dump() for b in reply.content]})
        uses = [b for b in reply.content if b.type == "tool_use"]
        if not uses:
            return None  # the answer is the last message: reward.fn scores it
        results = []
        for use in uses:
            try:
                result = str(multiply(**use.input))
            except (TypeError, ValueError) as e:
                result = f"Error: {e}"
            results.append({"type": "tool_result", "tool_use_id": use.id, "content": result})
        messages.append({"role": "user", "content": results})
    return None
