"""Tool-call parsers: the assistant's sampled text -> content and tool calls.

A parser is ``fn(text) -> ParsedTurn``, chosen by name from ``PARSERS`` or given
as ``'path/to/file.py:fn'`` / ``'package.module:fn'``. A malformed call never
raises: it becomes an entry of ``ParsedTurn.errors``, which the environment
reports back to the model so it can correct itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from rlpost.rollout.agent.specs import SPEC_FORMS, load_object


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, object]
    id: str


@dataclass
class ParsedTurn:
    content: str  # text outside the tool-call blocks, stripped
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one message per malformed block


Parser = Callable[[str], ParsedTurn]


class ParserError(ValueError):
    """A parser name or spec cannot be resolved; the message says what to change."""


HERMES_OPEN = "<tool_call>"
HERMES_CLOSE = "</tool_call>"


def parse_hermes(text: str) -> ParsedTurn:
    """Hermes-style calls, as the Qwen2.5 / Qwen3 chat templates render them:
    ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, zero or more blocks.

    ``arguments`` may be an object or a JSON string holding one; missing means ``{}``.
    Calls get ids ``call_0``, ``call_1``, ... in order of appearance. Bad JSON, a
    missing name, bad arguments, an unclosed ``<tool_call>`` or a stray
    ``</tool_call>`` are reported in ``errors`` and left out of ``content``.
    """
    content: list[str] = []
    calls: list[ToolCall] = []
    errors: list[str] = []
    rest = text
    while rest:
        start = rest.find(HERMES_OPEN)
        stray = rest.find(HERMES_CLOSE, 0, start if start >= 0 else len(rest))
        if stray >= 0:
            content.append(rest[:stray])
            errors.append(f"found {HERMES_CLOSE} without a matching {HERMES_OPEN}")
            rest = rest[stray + len(HERMES_CLOSE) :]
            continue
        if start < 0:
            content.append(rest)
            break
        content.append(rest[:start])
        body_start = start + len(HERMES_OPEN)
        end = rest.find(HERMES_CLOSE, body_start)
        if end < 0:
            errors.append(
                f"unclosed {HERMES_OPEN}: close each call with {HERMES_CLOSE} "
                f"(got {_clip(rest[body_start:])!r})"
            )
            break
        call, error = _hermes_call(rest[body_start:end], f"call_{len(calls)}")
        if call is not None:
            calls.append(call)
        else:
            errors.append(error)
        rest = rest[end + len(HERMES_CLOSE) :]
    return ParsedTurn(content="".join(content).strip(), tool_calls=calls, errors=errors)


def _hermes_call(body: str, call_id: str) -> tuple[ToolCall | None, str]:
    expected = 'expected {"name": "<tool name>", "arguments": {...}}'
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return None, f"tool call is not valid JSON ({e.msg} at char {e.pos}): {_clip(body)!r}"
    if not isinstance(obj, dict):
        return None, f"tool call is a JSON {type(obj).__name__}, {expected}"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None, f"tool call has no 'name' string, {expected}: {_clip(body)!r}"
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            return None, f"tool call {name!r}: 'arguments' string is not valid JSON ({e.msg})"
    if not isinstance(arguments, dict):
        return None, f"tool call {name!r}: 'arguments' must be an object, got {arguments!r}"
    return ToolCall(name=name, arguments=arguments, id=call_id), ""


def _clip(text: str, limit: int = 200) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + "..."


PARSERS: dict[str, Parser] = {"hermes": parse_hermes}


def get_parser(name: str) -> Parser:
    """The parser registered as ``name``, or the function a spec names."""
    if name in PARSERS:
        return PARSERS[name]
    if ":" not in name:
        raise ParserError(
            f"tool-call parser {name!r} is not registered; choose one of {sorted(PARSERS)} "
            f"or give {SPEC_FORMS}"
        )
    fn = load_object(name, "tool-call parser", ParserError)
    if not callable(fn):
        raise ParserError(
            f"tool-call parser {name!r}: has type {type(fn).__name__}, not callable; "
            "point the spec at a function fn(text) -> ParsedTurn"
        )
    return fn
