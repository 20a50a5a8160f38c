"""An agent written against the OpenAI API, trained by rlpost unchanged.

    python -m rlpost.main algo=grpo agent=calculator \\
        agent.program=examples/agents/openai_calculator.py:run

rlpost calls ``run(client, row)`` once per episode with an ``openai.AsyncOpenAI``
client bound to that episode's session on its chat endpoint. The program keeps
the chat, runs the tool itself and returns None: the task's reward (``reward.fn``)
then scores the last answer. It is the loop any tool-calling agent runs; nothing
in it knows about training.
"""

import json

MULTIPLY = {
    "type": "function",
    "function": {
        "name": "multiply",
        "description": "Multiply two integers.",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "description": "The first factor."},
                "b": {"type": "integer", "description": "The second factor."},
            },
            "required": ["a", "b"],
        },
    },
}


def multiply(a: int, b: int) -> int:
    return a * b


async def run(client, row, max_turns: int = 3):
    messages = [{"role": "user", "content": row["prompt"]}]
    for _ in range(max_turns):
        reply = await client.chat.completions.create(
            model="policy", messages=messages, tools=[MULTIPLY]
        )
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return None  # the answer is the last message: reward.fn scores it
        for call in message.tool_calls:
            try:
                result = str(multiply(**json.loads(call.function.arguments)))
            except (TypeError, ValueError) as e:
                result = f"Error: {e}"
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "name": "multiply", "content": result}
            )
    return None
