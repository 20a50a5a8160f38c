"""What every environment shares: the ``reset`` / ``step`` protocol, its error and
the helpers adapters need (see ``env.py``, ``adapters.py``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from rlpost.rollout.agent.parsers import ToolCall

if TYPE_CHECKING:
    from rlpost.rollout.agent.tools import ToolOutcome

StepResult = tuple[list[dict], bool, float | None]


class Env(Protocol):
    def reset(self, row: dict) -> list[dict] | Awaitable[list[dict]]: ...

    def step(self, message: dict) -> StepResult | Awaitable[StepResult]: ...


EnvFactory = Callable[[], Env]


class EnvError(ValueError):
    """An environment cannot be loaded or built; the message says what to change."""


def prompt_messages(row: dict) -> list[dict]:
    """The row's ``prompt`` as chat messages; a string is one user message."""
    prompt = row["prompt"]
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)


def tool_calls_of(message: dict) -> list[ToolCall]:
    """The ``ToolCall``s of an assistant message in the OpenAI form."""
    calls = []
    for i, raw in enumerate(message.get("tool_calls") or []):
        fn = raw.get("function", raw)
        calls.append(ToolCall(fn["name"], dict(fn.get("arguments") or {}), raw.get("id", f"{i}")))
    return calls


def tool_replies(outcomes: Sequence[ToolOutcome], errors: Sequence[str]) -> list[dict]:
    """One ``tool`` message per call's outcome, then one per malformed call block."""
    replies = [
        {"role": "tool", "name": o.call.name, "content": o.text, "tool_call_id": o.call.id}
        for o in outcomes
    ]
    replies += [
        {"role": "tool", "name": "invalid_tool_call", "content": f"Error: {e}"} for e in errors
    ]
    return replies
