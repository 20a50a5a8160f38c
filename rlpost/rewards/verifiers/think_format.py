"""``reward.fn=think_format``: is the completion ``<think>reasoning</think>answer``?

1.0 when the completion (up to its first special token) is one non-empty
``<think>...</think>`` block at the start, after optional whitespace, followed
by a non-empty answer, with no other think tag anywhere; 0.0 otherwise.

Chat templates of reasoning models often end the prompt with ``<think>``, so
the completion starts inside the block: a completion with no opening tag and
exactly one ``</think>`` counts when the row's prompt (a string, or the last
chat message) ends with ``<think>``, and only then.
"""

from __future__ import annotations

from rlpost.rewards.verifiers.columns import prompt_text, without_special_tokens

OPEN, CLOSE = "<think>", "</think>"


def think_format_reward(completion: str, row: dict) -> dict[str, float]:
    """``{"think_format": 1.0}`` for a well-formed think block and answer, else 0.0."""
    text = without_special_tokens(completion).lstrip()
    if text.startswith(OPEN):
        text = text[len(OPEN) :]
    elif not prompt_text(row).rstrip().endswith(OPEN):
        return {"think_format": 0.0}
    if OPEN in text or text.count(CLOSE) != 1:
        return {"think_format": 0.0}
    reasoning, _, answer = text.partition(CLOSE)
    return {"think_format": float(bool(reasoning.strip()) and bool(answer.strip()))}
