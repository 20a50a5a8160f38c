"""The OpenAI chat format as the endpoint reads and writes it: request messages
normalised for the chat template and the history match, an assistant message's
tool calls sent back as OpenAI sends them, and the error a refused request returns
(an OpenAI-style body with its HTTP status)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping


class RequestError(Exception):
    """A request the endpoint refuses: an OpenAI-style error body and HTTP status."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code

    def body(self) -> dict:
        kind = {401: "authentication_error", 404: "not_found_error"}.get(
            self.status, "invalid_request_error" if self.status < 500 else "server_error"
        )
        return {
            "error": {"message": str(self), "type": kind, "param": self.param, "code": self.code}
        }


def normalise_message(message: object, where: str) -> dict:
    """A request message in the form the chat template and the history match use:
    text content (``None`` -> ``""``, text parts joined), tool-call arguments parsed
    from their JSON string into a dict."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise RequestError(400, f"{where} must be an object with a 'role'", "messages")
    out: dict[str, object] = {
        "role": message["role"],
        "content": _text(message.get("content"), where),
    }
    for key in ("name", "tool_call_id"):
        if message.get(key) is not None:
            out[key] = message[key]
    calls = message.get("tool_calls")
    if calls:
        if not isinstance(calls, list):
            raise RequestError(400, f"{where}.tool_calls must be a list", "messages")
        out["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(calls)]
    return out


def _text(content: object, where: str) -> str:
    if content is None:
        return ""

    def refuse(part: object, _: int) -> RequestError:
        return RequestError(400, f"{where}.content: only text parts are supported, got "
                            f"{part_kind(part)!r}", "messages")  # fmt: skip

    return joined_text(content, f"{where}.content", refuse)


def refuse_unknown(
    body: dict, honoured: set[str], harmless: set[str], neutral: Mapping[str, object] | None = None
) -> None:
    """Refuse a request naming a parameter that is neither served (``honoured``) nor
    without effect on the sampled tokens (``harmless``): never ignored silently. A
    parameter sent as ``null``, or at the value that asks for nothing (``neutral``:
    ``frequency_penalty=0``, ``logprobs=false``), is taken as not sent."""
    neutral = neutral or {}
    unknown = sorted(
        k for k in set(body) - honoured - harmless
        if body[k] is not None and not (k in neutral and body[k] == neutral[k])
    )  # fmt: skip
    if unknown:
        raise RequestError(
            400,
            f"{', '.join(unknown)}: not supported by this endpoint (it serves "
            f"{', '.join(sorted(honoured))})",
            unknown[0],
        )


def part_kind(part: object) -> object:
    """A content part's ``type``, or what it is when it is not an object."""
    return part.get("type") if isinstance(part, dict) else type(part).__name__


def joined_text(
    content: object,
    where: str,
    refuse: Callable[[object, int], RequestError],
    kinds: tuple[str, ...] = ("text",),
    noun: str = "text parts",
    param: str = "messages",
) -> str:
    """``content`` as it is when a string, else the text of its parts joined (each an
    object whose ``type`` is one of ``kinds``); ``refuse(part, index)`` is the error
    for any other part. Shared by the three request formats the endpoint reads."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(400, f"{where} must be a string or a list of {noun}", param)
    texts = []
    for i, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in kinds:
            raise refuse(part, i)
        texts.append(str(part.get("text", "")))
    return "".join(texts)


def _tool_call(call: object, where: str) -> dict:
    fn = call.get("function") if isinstance(call, dict) else None
    if (
        not isinstance(call, dict)
        or not isinstance(fn, dict)
        or not isinstance(fn.get("name"), str)
    ):
        raise RequestError(400, f"{where} must hold a function with a name", "messages")
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            pass  # kept as the string the agent sent; the template renders it as it is
    return {
        "id": call.get("id"),
        "type": "function",
        "function": {"name": fn["name"], "arguments": args},
    }


def comparable(message: dict) -> tuple:
    """What two messages must share to be the same turn of a chat: role, text, and
    tool calls by name and arguments (ids left out)."""
    calls = tuple(
        (c["function"]["name"], json.dumps(c["function"]["arguments"], sort_keys=True))
        for c in message.get("tool_calls") or []
    )
    return message["role"], message.get("content") or "", calls


def openai_tool_calls(message: dict) -> list[dict]:
    """An assistant message's tool calls as OpenAI sends them: arguments a JSON string."""
    return [
        {
            "id": c["id"],
            "type": "function",
            "function": {
                "name": c["function"]["name"],
                "arguments": json.dumps(c["function"]["arguments"]),
            },
        }
        for c in message.get("tool_calls") or []
    ]
