"""The Anthropic Messages API as the endpoint reads and writes it.

A ``POST /v1/messages`` request is turned into the chat-completions request the
endpoint already answers (``chat_request``), so its tokens are captured the same
way, and the answer is turned back into a Messages response (``message_reply``)
or its server-sent events (``stream_events``):

- ``system`` (a string or text blocks) is the chat's first, system message;
- a ``user`` message's ``tool_result`` blocks are ``tool`` messages (in their
  order, before the message's text), its ``text`` blocks one user message;
- an ``assistant`` message's ``text`` blocks are its content and its
  ``tool_use`` blocks its tool calls (``input`` as the arguments);
- ``tools`` (``name``, ``description``, ``input_schema``) are function tools;
  ``tool_choice`` ``auto`` and ``none`` are served (the policy samples
  unconstrained, so ``any`` and a named tool are refused);
- ``max_tokens`` (required), ``stop_sequences``, ``temperature``, ``top_p``.

A content block of another type (``image``, ``document``, ``thinking``, ...)
or a parameter the endpoint cannot honour (``top_k``) is refused with
Anthropic's error body naming it, never dropped silently.
"""

from __future__ import annotations

import json
import uuid

from rlpost.rollout.agent.openai_messages import (
    RequestError,
    joined_text,
    part_kind,
    refuse_unknown,
)

# Parameters read here; the others are refused, except those that change nothing
# about the sampled tokens.
HONOURED = {"model", "messages", "system", "max_tokens", "stop_sequences", "temperature",
            "top_p", "tools", "tool_choice", "stream"}  # fmt: skip
HARMLESS = {"metadata", "service_tier"}
NEUTRAL = {"thinking": {"type": "disabled"}}  # asks for nothing beyond what is served
FINISH_TO_STOP = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}


def error_body(error: RequestError) -> dict:
    """A refused request's body as Anthropic's API writes it."""
    kind = ERROR_TYPES.get(error.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": str(error)}}


def chat_request(body: dict) -> dict:
    """The chat-completions request that asks the same of the policy as ``body``."""
    refuse_unknown(body, HONOURED, HARMLESS, NEUTRAL)
    limit = body.get("max_tokens")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise RequestError(
            400, f"max_tokens={limit!r}: a positive integer is required", "max_tokens"
        )
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise RequestError(400, "'messages' must be a non-empty list", "messages")
    messages = _system(body.get("system"))
    for i, message in enumerate(raw):
        messages += _messages(message, f"messages[{i}]")
    out: dict[str, object] = {"messages": messages, "max_tokens": limit}
    for key in ("model", "temperature", "top_p"):
        if body.get(key) is not None:
            out[key] = body[key]
    stops = body.get("stop_sequences")
    if stops is not None:
        out["stop"] = stops
    if body.get("tools"):
        out["tools"] = _tools(body["tools"])
    out["tool_choice"] = _tool_choice(body.get("tool_choice"))
    return out


def message_reply(reply: dict, stop: str | None) -> dict:
    """The chat-completions ``reply`` as a Messages response; ``stop`` is the stop
    sequence its text was cut at, if any."""
    choice = reply["choices"][0]
    message = choice["message"]
    text = message.get("content") or ""
    content: list[dict] = [{"type": "text", "text": text}] if text else []
    for call in message.get("tool_calls") or []:
        arguments = call["function"]["arguments"]
        try:
            parsed = json.loads(arguments) if arguments else {}
        except json.JSONDecodeError:
            parsed = {}
        content.append({
            "type": "tool_use", "id": _tool_use_id(call.get("id")),
            "name": call["function"]["name"],
            "input": parsed if isinstance(parsed, dict) else {"value": parsed},
        })  # fmt: skip
    stop_reason = FINISH_TO_STOP[choice["finish_reason"]]
    if stop is not None:
        stop_reason = "stop_sequence"
    usage = reply["usage"]
    return {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "model": reply["model"],
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop,
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "output_tokens": usage["completion_tokens"],
        },
    }


def stream_events(message: dict) -> list[tuple[str, dict]]:
    """``message`` as the server-sent events of a streamed Messages response:
    ``(event name, data)`` in order, each block whole in one delta."""
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {**message["usage"], "output_tokens": 0}}  # fmt: skip
    events: list[tuple[str, dict]] = [
        ("message_start", {"type": "message_start", "message": start})
    ]
    for index, block in enumerate(message["content"]):
        opening: dict[str, object]
        if block["type"] == "text":
            opening = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            opening = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events += [
            ("content_block_start", {"type": "content_block_start", "index": index, "content_block": opening}),
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": index}),
        ]  # fmt: skip
    events.append((
        "message_delta",
        {"type": "message_delta",
         "delta": {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]},
         "usage": {"output_tokens": message["usage"]["output_tokens"]}},
    ))  # fmt: skip
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def _system(system: object) -> list[dict]:
    if system is None:
        return []
    return [{"role": "system", "content": _texts(system, "system")}]


def _texts(content: object, where: str) -> str:
    """A string, or text blocks joined."""
    return joined_text(
        content, where, lambda block, i: _unsupported(block, f"{where}[{i}]"), noun="text blocks"
    )


def _messages(message: object, where: str) -> list[dict]:
    """One Messages-API message as chat messages."""
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
        raise RequestError(
            400, f"{where} must be an object with role 'user' or 'assistant'", "messages"
        )
    role, content = message["role"], message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise RequestError(400, f"{where}.content must be a string or a list of blocks", "messages")
    if role == "assistant":
        texts, calls = [], []
        for i, block in enumerate(content):
            kind = part_kind(block)
            if kind == "text":
                texts.append(str(block.get("text", "")))
            elif kind == "tool_use":
                calls.append({
                    "id": block.get("id"), "type": "function",
                    "function": {"name": block.get("name"), "arguments": block.get("input") or {}},
                })  # fmt: skip
            else:
                raise _unsupported(block, f"{where}.content[{i}]")
        out: dict[str, object] = {"role": "assistant", "content": "".join(texts)}
        if calls:
            out["tool_calls"] = calls
        return [out]
    results, texts = [], []
    for i, block in enumerate(content):
        kind = part_kind(block)
        if kind == "tool_result":
            text = _texts(block.get("content", ""), f"{where}.content[{i}].content")
            results.append(
                {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text}
            )
        elif kind == "text":
            texts.append(str(block.get("text", "")))
        else:
            raise _unsupported(block, f"{where}.content[{i}]")
    return results + ([{"role": "user", "content": "".join(texts)}] if texts else [])


def _tools(tools: object) -> list[dict]:
    if not isinstance(tools, list):
        raise RequestError(400, "'tools' must be a list", "tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise RequestError(400, f"tools[{i}] must be an object with a 'name'", "tools")
        if tool.get("type") not in (None, "custom"):
            raise RequestError(
                400, f"tools[{i}]: type {tool['type']!r} is a server tool; only client tools "
                "(name, description, input_schema) are served", "tools",
            )  # fmt: skip
        function = {
            "name": tool["name"],
            "parameters": tool.get("input_schema") or {"type": "object"},
        }
        if tool.get("description"):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: object) -> str:
    kind = choice.get("type") if isinstance(choice, dict) else choice
    if kind in (None, "auto"):
        return "auto"
    if kind == "none":
        return "none"
    raise RequestError(
        400, f"tool_choice={choice!r}: only 'auto' and 'none' are supported (the policy samples "
        "unconstrained)", "tool_choice",
    )  # fmt: skip


def _unsupported(block: object, where: str) -> RequestError:
    return RequestError(
        400, f"{where}: content blocks of type {part_kind(block)!r} are not supported (text, "
        "tool_use and tool_result are)", "messages",
    )  # fmt: skip


def _tool_use_id(call_id: object) -> str:
    """Anthropic's ids read ``toolu_...``; the endpoint's own are kept as they are."""
    return str(call_id) if call_id else f"toolu_{uuid.uuid4().hex[:24]}"
