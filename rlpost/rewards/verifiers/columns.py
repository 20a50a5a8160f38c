"""What the verifiers read from a row: the reference answer and the prompt's last text."""

from __future__ import annotations

ANSWER_COLUMNS = "'answer', 'ground_truth' or reward_model['ground_truth'] (verl's layout)"
# Chat models spell their special tokens "<|...|>" (Qwen's "<|im_end|>"); a
# completion decoded with special tokens is cut at the first one.
SPECIAL_TOKEN_PREFIX = "<|"


def reference_answer(row: dict) -> object:
    """The row's ``answer``, else its ``ground_truth``, else ``reward_model["ground_truth"]``.

    A row with none of them (or only None) is a ValueError naming the columns
    looked for: a data problem, not a wrong completion.
    """
    for column in ("answer", "ground_truth"):
        if row.get(column) is not None:
            return row[column]
    spec = row.get("reward_model")
    if isinstance(spec, dict) and spec.get("ground_truth") is not None:
        return spec["ground_truth"]
    raise ValueError(f"the row has no answer: add {ANSWER_COLUMNS} (columns: {sorted(row)})")


def without_special_tokens(completion: str) -> str:
    """The completion up to its first special token (an end-of-turn token decoded as text)."""
    return completion.split(SPECIAL_TOKEN_PREFIX, 1)[0]


def prompt_text(row: dict) -> str:
    """The prompt as the model last saw it: a string prompt, or the content of the
    last chat message when that content is a string; else ``""``."""
    prompt = row.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        prompt = prompt[-1].get("content")
    return prompt if isinstance(prompt, str) else ""
