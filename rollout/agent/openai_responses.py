"""OpenAI's Responses API as the endpoint reads and writes it.

A ``POST /v1/responses`` request is turned into the chat-completions request the
endpoint already answers (``chat_request``), so its tokens are captured the same
way, and the answer into a Response (``response_reply``) or its server-sent
events (``stream_events``):

- ``instructions`` is the chat's first, system message;
- ``input`` is a string (one user message) or items: messages (``user``,
  ``assistant``, ``system``; ``developer`` is a system message) with text or
  ``input_text`` / ``output_text`` parts, ``function_call`` items (the tool
  calls of the assistant turn they follow) and ``function_call_output`` items
  (tool turns);
- ``previous_response_id`` continues a response of the same episode: its
  messages and its output come first (``ResponseStore``);
- ``tools`` of type ``function``; ``tool_choice`` ``auto`` and ``none``;
  ``max_output_tokens``, ``temperature``, ``top_p``.

An item or content part of another type, a built-in tool (``web_search``, ...),
or a parameter the endpoint cannot honour (``reasoning``, ``text.format``) is
refused with an OpenAI error body naming it, never dropped silently.
"""

from __future__ import annotations

import time
import uuid

from rlpost.rollout.agent.openai_messages import (
    RequestError,
    joined_text,
    part_kind,
    refuse_unknown,
)

HONOURED = {"model", "input", "instructions", "previous_response_id", "tools", "tool_choice",
            "max_output_tokens", "temperature", "top_p", "stream"}  # fmt: skip
# Accepted and without effect on the sampled tokens.
HARMLESS = {"store", "metadata", "user", "parallel_tool_calls", "truncation", "include",
            "service_tier", "prompt_cache_key", "safety_identifier"}  # fmt: skip
# Values that ask for nothing beyond what is served.
NEUTRAL = {"text": {"format": {"type": "text"}}, "background": False, "top_logprobs": 0}
TEXT_PARTS = ("input_text", "output_text", "text")


class ResponseStore:
    """One episode's responses by id: the chat messages each one's request held, and
    its output message, for ``previous_response_id``."""

    def __init__(self) -> None:
        self._chats: dict[str, list[dict]] = {}

    def add(self, response_id: str, messages: list[dict]) -> None:
        self._chats[response_id] = messages

    def chat(self, response_id: object) -> list[dict]:
        if not isinstance(response_id, str) or response_id not in self._chats:
            raise RequestError(
                400, f"previous_response_id={response_id!r}: no such response in this episode "
                "(a response is kept for the episode that made it)", "previous_response_id",
            )  # fmt: skip
        return list(self._chats[response_id])


def chat_request(body: dict, store: ResponseStore) -> dict:
    """The chat-completions request that asks the same of the policy as ``body``."""
    refuse_unknown(body, HONOURED, HARMLESS, NEUTRAL)
    messages: list[dict] = []
    if body.get("previous_response_id") is not None:
        messages = store.chat(body["previous_response_id"])
    if body.get("instructions"):
        instructions = {"role": "system", "content": _text(body["instructions"], "instructions")}
        if messages and messages[0]["role"] == "system":
            messages[0] = instructions
        else:
            messages.insert(0, instructions)
    messages += _input(body.get("input"))
    if not messages:
        raise RequestError(400, "'input' must be a string or a non-empty list of items", "input")
    out: dict[str, object] = {"messages": messages}
    for key in ("model", "temperature", "top_p"):
        if body.get(key) is not None:
            out[key] = body[key]
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    if body.get("tools"):
        out["tools"] = _tools(body["tools"])
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise RequestError(
            400, f"tool_choice={choice!r}: only 'auto' and 'none' are supported (the policy "
            "samples unconstrained)", "tool_choice",
        )  # fmt: skip
    out["tool_choice"] = choice or "auto"
    return out


def response_reply(reply: dict, body: dict, response_id: str) -> dict:
    """The chat-completions ``reply`` as a Response with id ``response_id``."""
    choice = reply["choices"][0]
    message = choice["message"]
    output: list[dict] = []
    if message.get("content"):
        output.append({
            "type": "message", "id": f"msg_{uuid.uuid4().hex}", "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": message["content"], "annotations": []}],
        })  # fmt: skip
    for call in message.get("tool_calls") or []:
        output.append({
            "type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call["id"],
            "name": call["function"]["name"], "arguments": call["function"]["arguments"],
            "status": "completed",
        })  # fmt: skip
    cut = choice["finish_reason"] == "length"
    usage = reply["usage"]
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "model": reply["model"],
        "instructions": body.get("instructions"),
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "previous_response_id": body.get("previous_response_id"),
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        },
    }


def stream_events(response: dict) -> list[tuple[str, dict]]:
    """``response`` as the server-sent events of a streamed Response, in order, each
    output item whole in one delta."""
    opening = {**response, "status": "in_progress", "output": [], "usage": None}
    events: list[tuple[str, dict]] = [
        ("response.created", {"response": opening}),
        ("response.in_progress", {"response": opening}),
    ]
    for index, item in enumerate(response["output"]):
        empty: dict[str, object] = (
            {"content": []} if item["type"] == "message" else {"arguments": ""}
        )
        added = {**item, "status": "in_progress", **empty}
        events.append(("response.output_item.added", {"output_index": index, "item": added}))
        if item["type"] == "message":
            part = item["content"][0]
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events += [
                ("response.content_part.added", {**where, "part": {**part, "text": ""}}),
                ("response.output_text.delta", {**where, "delta": part["text"], "logprobs": []}),
                ("response.output_text.done", {**where, "text": part["text"], "logprobs": []}),
                ("response.content_part.done", {**where, "part": part}),
            ]
        else:
            where = {"item_id": item["id"], "output_index": index}
            events += [
                ("response.function_call_arguments.delta", {**where, "delta": item["arguments"]}),
                ("response.function_call_arguments.done", {**where, "arguments": item["arguments"],
                                                            "name": item["name"]}),
            ]  # fmt: skip
        events.append(("response.output_item.done", {"output_index": index, "item": item}))
    done = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    events.append((done, {"response": response}))
    return [
        (name, {"type": name, "sequence_number": i, **data})
        for i, (name, data) in enumerate(events)
    ]


def _text(content: object, where: str) -> str:
    """A string, or text parts joined."""

    def refuse(part: object, i: int) -> RequestError:
        return RequestError(
            400, f"{where}[{i}]: content parts of type {part_kind(part)!r} are not supported "
            f"({', '.join(TEXT_PARTS)} are)", "input",
        )  # fmt: skip

    return joined_text(content, where, refuse, kinds=TEXT_PARTS, param="input")


def _input(items: object) -> list[dict]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise RequestError(400, "'input' must be a string or a list of items", "input")
    out: list[dict] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else type(item).__name__
        if kind == "message" and isinstance(item, dict):
            role = item.get("role")
            role = "system" if role == "developer" else role
            if role not in ("user", "assistant", "system"):
                raise RequestError(400, f"{where}.role={item.get('role')!r}: user, assistant, "
                                   "system or developer", "input")  # fmt: skip
            out.append(
                {"role": role, "content": _text(item.get("content", ""), f"{where}.content")}
            )
        elif kind == "function_call" and isinstance(item, dict):
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "")}}  # fmt: skip
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output" and isinstance(item, dict):
            output = item.get("output", "")
            text = output if isinstance(output, str) else _text(output, f"{where}.output")
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        else:
            raise RequestError(
                400, f"{where}: items of type {kind!r} are not supported (message, "
                "function_call and function_call_output are)", "input",
            )  # fmt: skip
    return out


def _tools(tools: object) -> list[dict]:
    if not isinstance(tools, list):
        raise RequestError(400, "'tools' must be a list", "tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise RequestError(
                400, f"tools[{i}]: type {kind!r} is not served; only function tools are "
                "(the model's calls come back for the agent to run)", "tools",
            )  # fmt: skip
        function = {
            "name": tool.get("name"),
            "parameters": tool.get("parameters") or {"type": "object"},
        }
        if tool.get("description"):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out
