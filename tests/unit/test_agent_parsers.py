"""Hermes tool-call parsing: calls, content, and malformed blocks as errors, never raises."""

from __future__ import annotations

import pytest

from rlpost.rollout.agent.parsers import PARSERS, ParsedTurn, ParserError, ToolCall, get_parser


def test_no_calls_is_stripped_content():
    assert PARSERS["hermes"]("  The answer is 4.\n") == ParsedTurn("The answer is 4.", [], [])


def test_several_calls_and_content_around_them():
    text = (
        "Let me check.\n<tool_call>\n"
        '{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
        '<tool_call>{"name": "search", "arguments": "{\\"q\\": \\"cats\\"}"}</tool_call> done'
    )
    parsed = get_parser("hermes")(text)
    assert parsed.tool_calls == [
        ToolCall("add", {"a": 1, "b": 2}, "call_0"),
        ToolCall("search", {"q": "cats"}, "call_1"),  # arguments given as a JSON string
    ]
    assert parsed.content == "Let me check.\n\n done" and parsed.errors == []


def test_missing_arguments_mean_none():
    parsed = PARSERS["hermes"]('<tool_call>{"name": "now"}</tool_call>')
    assert parsed.tool_calls == [ToolCall("now", {}, "call_0")] and parsed.errors == []


@pytest.mark.parametrize(
    "block, message",
    [
        ('<tool_call>{"name": "add", "arguments": {"a": 1</tool_call>', "not valid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', "no 'name'"),
        ("<tool_call>[1, 2]</tool_call>", "JSON list"),
        ('<tool_call>{"name": "f", "arguments": "{oops"}</tool_call>', "'arguments' string"),
        ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "must be an object"),
        ('<tool_call>{"name": "f", "arguments": {}}', "unclosed <tool_call>"),
        ("x </tool_call> y", "without a matching"),
    ],
)
def test_malformed_blocks_are_errors(block, message):
    parsed = PARSERS["hermes"](f"before {block}")
    assert parsed.tool_calls == []
    assert len(parsed.errors) == 1 and message in parsed.errors[0]
    assert "<tool_call>" not in parsed.content and parsed.content.startswith("before")


def test_a_good_call_survives_a_bad_one():
    text = '<tool_call>{bad}</tool_call><tool_call>{"name": "ok", "arguments": {}}</tool_call>'
    parsed = PARSERS["hermes"](text)
    assert parsed.tool_calls == [ToolCall("ok", {}, "call_0")] and len(parsed.errors) == 1


def test_parser_by_spec_and_errors(tmp_path):
    (tmp_path / "p.py").write_text(
        "from rollout.agent.parsers import ParsedTurn\n"
        "def upper(text):\n    return ParsedTurn(text.upper())\n"
        "NOT_CALLABLE = 3\n"
    )
    assert get_parser(f"{tmp_path}/p.py:upper")("hi").content == "HI"
    with pytest.raises(ParserError, match="not registered; choose one of \\['hermes'\\]"):
        get_parser("hermes2")
    with pytest.raises(ParserError, match="not callable"):
        get_parser(f"{tmp_path}/p.py:NOT_CALLABLE")
    with pytest.raises(ParserError, match="does not exist"):
        get_parser(f"{tmp_path}/missing.py:upper")
