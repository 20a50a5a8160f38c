"""An agent program for the CLI test: a tool round trip per episode, with rows that
edit their history (a prefix break) or fail (a program error). Its rows have no
'prompt': it writes the messages from the row's 'question'. Each episode's
sampled token counts go to the file in RLPOST_TEST_TOKENS, one JSON line each."""

import json
import os

MULTIPLY = {
    "type": "function",
    "function": {
        "name": "multiply",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
    },
}


async def run(client, row):
    messages = [{"role": "user", "content": row["question"]}]
    first = await client.chat.completions.create(
        model="policy", messages=messages, tools=[MULTIPLY], max_tokens=12
    )
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    if row["mode"] == "raise":
        log(row, [first.usage.completion_tokens])
        raise RuntimeError("the agent's own bug")
    if row["mode"] == "edit":  # the agent summarises: it drops the turns so far
        messages = [{"role": "user", "content": row["question"] + " again"}]
    else:
        messages.append({"role": "tool", "tool_call_id": "call_0", "content": "42"})
    second = await client.chat.completions.create(model="policy", messages=messages, max_tokens=12)
    log(row, [first.usage.completion_tokens, second.usage.completion_tokens])
    return len(second.choices[0].message.content or "") / 12.0


def log(row, tokens):
    with open(os.environ["RLPOST_TEST_TOKENS"], "a") as f:
        f.write(json.dumps({"split": row["split"], "mode": row["mode"], "tokens": tokens}) + "\n")
