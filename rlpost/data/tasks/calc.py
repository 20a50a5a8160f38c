"""Products of two numbers with a tool: the built-in multi-turn agent task.

A prompt is one user message ``"37*58="``. The tiny model cannot multiply, but it
can call the ``multiply`` tool and copy the result: an episode is

    user       37*58=
    assistant  <tool_call>{"name":"multiply","arguments":{"a":37,"b":58}}</tool_call>
    tool       2146
    assistant  2146

and the reward scores the final answer. The call is the most compact JSON the
hermes parser accepts, since the model has to emit every character of it.
:meth:`CalcTask.sft_rows` are these chats, which the warm-up imitates; they
render token for token like the episodes the agent loop produces.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

# The episode's final answer is scored as the arithmetic task scores its completion:
# ``correctness`` (the text up to the end token equals the answer) and ``format``
# (digits only), correctness alone in the default total.
from rlpost.data.tasks.arith import correctness, format_reward, reward, split_pairs

__all__ = ["CalcTask", "correctness", "format_reward", "reward", "solved_chat", "tool_call_text"]

DATA_SOURCE = "calc"
TOOL = "multiply"


@dataclass(frozen=True)
class CalcTask:
    """All ordered pairs ``(a, b)`` with ``min_operand <= a, b <= max_operand``, split by
    ``seed``: ``num_val`` are held out, the rest train; the two share no pair."""

    seed: int = 0
    max_operand: int = 99
    num_val: int = 200
    min_operand: int = 10
    # the fields sft_rows depends on (num_val: held-out pairs are not trained on)
    SFT_FIELDS: ClassVar[tuple[str, ...]] = ("seed", "max_operand", "num_val", "min_operand")

    def __post_init__(self) -> None:
        if not 0 <= self.min_operand <= self.max_operand:
            raise ValueError(
                f"operands must satisfy 0 <= min_operand <= max_operand, got "
                f"min_operand={self.min_operand}, max_operand={self.max_operand}"
            )
        n_pairs = (self.max_operand - self.min_operand + 1) ** 2
        if not 0 <= self.num_val < n_pairs:
            raise ValueError(
                f"num_val must be in [0, {n_pairs}) for operands in "
                f"[{self.min_operand}, {self.max_operand}], got {self.num_val}"
            )

    def _split(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        return split_pairs(self.min_operand, self.max_operand, self.num_val, self.seed)

    def train_rows(self) -> list[dict]:
        """Every pair not held out, in a seeded shuffled order."""
        return [make_row(a, b) for a, b in self._split()[0]]

    def val_rows(self) -> list[dict]:
        """The ``num_val`` held-out pairs."""
        return [make_row(a, b) for a, b in self._split()[1]]

    def sft_rows(self) -> list[dict]:
        """Training rows with the whole solved episode in ``"messages"``."""
        return [{**row, "messages": solved_chat(row)} for row in self.train_rows()]


def make_row(a: int, b: int) -> dict:
    return {"prompt": f"{a}*{b}=", "answer": str(a * b), "data_source": DATA_SOURCE}


def tool_call_text(a: int, b: int) -> str:
    """The assistant's call of ``multiply(a, b)`` in the hermes format, without spaces."""
    call = {"name": TOOL, "arguments": {"a": a, "b": b}}
    return f"<tool_call>{json.dumps(call, separators=(',', ':'))}</tool_call>"


def solved_chat(row: dict) -> list[dict]:
    """The episode that solves ``row``: the call, the tool's answer, the final answer.

    The tool message is the one the tool environment sends (the template renders
    only role and content); assistant turns hold the exact text the model samples.
    """
    a, b = (int(x) for x in row["prompt"].rstrip("=").split("*"))
    return [
        {"role": "user", "content": row["prompt"]},
        {"role": "assistant", "content": tool_call_text(a, b)},
        {"role": "tool", "name": TOOL, "content": str(a * b), "tool_call_id": "call_0"},
        {"role": "assistant", "content": row["answer"]},
    ]
