"""An OpenAI- and Anthropic-compatible endpoint in front of the rollout engines.

Agent programs (``agent.program``) talk to the policy through it with an
unchanged ``openai`` client: ``POST /v1/chat/completions`` (``tools``,
``tool_choice``, ``temperature``, ``max_tokens`` / ``max_completion_tokens``,
``stop``, ``stream``), ``POST /v1/responses`` (``openai_responses``) and ``GET
/v1/models``, on localhost by default; or an unchanged ``anthropic`` client:
``POST /v1/messages`` (``anthropic_messages``). The last two are translated to
the chat request they mean and captured the same way.

**Sessions.** Each episode opens a session; its random API key *is* the session.
A request with an unknown key, or the key of an episode that has ended, is
refused with 401 and never attributed to another episode. Every call of a
session is generated with the session's id, so the rollout group's consistent
hashing keeps it on one replica (whose prefix cache holds its earlier turns).

**Token capture.** The endpoint records, per call, the prompt ids it rendered and
the ids and log-probs the engine sampled (``capture.Call``). When a request's
messages are the previous call's messages + the assistant message it returned +
new messages, the prompt is the previous prompt + the sampled ids + the new
messages' tokens as the chat template lays them out after them
(``ChatTokens.delta_ids``, as the native episode loop does): the model's earlier
turns are never re-tokenised. Every other request (edited or dropped history) is
rendered afresh, and ``capture.segments`` splits the trajectory there.

**What it does not do.** Sampling follows the run, not the request: the policy's
log-probs are only comparable with the trainer's at the run's temperature and
top-p, so a request's ``temperature`` / ``top_p`` that differ, and its ``seed``,
are ignored and counted (``Session.sampling_overridden``). Any other parameter that
would change the sampled tokens (``frequency_penalty``, ``logprobs``,
``response_format``, ``reasoning_effort``...) is refused with 400 naming it, and
counted (``Session.refused``): never served as a silently different request. ``n`` must be 1, and ``tool_choice``
can be ``"auto"`` or ``"none"`` (no tool-call parsing): the policy is never
constrained. A ``stop`` string ends the text the agent sees; the tokens sampled
after it are dropped from the trajectory. A streamed response is sent as
server-sent events once the completion is done. Each session has a budget, the
episode's model turns and response tokens: past it a call returns no text with
``finish_reason="length"`` and marks the episode truncated.

The sessions and their registry live in ``sessions``; the OpenAI message format
(normalised requests, tool calls as OpenAI sends them, error bodies) in
``openai_messages``; this module is the server and the capture of each call.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from rlpost.rollout.agent import anthropic_messages as am
from rlpost.rollout.agent import openai_responses as ro
from rlpost.rollout.agent.capture import Call
from rlpost.rollout.agent.chat import ChatTokens
from rlpost.rollout.agent.loop import _seed, assistant_message
from rlpost.rollout.agent.openai_messages import (
    RequestError,
    comparable,
    normalise_message,
    openai_tool_calls,
    refuse_unknown,
)
from rlpost.rollout.agent.parsers import ParsedTurn, get_parser
from rlpost.rollout.agent.sessions import Session, SessionRegistry
from rlpost.rollout.base import Completion, SamplingConfig

if TYPE_CHECKING:
    from aiohttp import web
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

GenerateFn = Callable[[list[int], SamplingConfig, str], Awaitable[Completion]]

# The chat route's parameters: those read, those without effect on the sampled tokens,
# and the values of others that ask for nothing; any other is refused, naming it.
CHAT_HONOURED = {"model", "messages", "n", "tools", "tool_choice", "max_tokens",
                 "max_completion_tokens", "stop", "stream", "stream_options", "temperature",
                 "top_p", "seed"}  # fmt: skip
CHAT_HARMLESS = {"store", "metadata", "user", "parallel_tool_calls", "service_tier",
                 "prompt_cache_key", "safety_identifier"}  # fmt: skip
CHAT_NEUTRAL = {"frequency_penalty": 0, "presence_penalty": 0, "logprobs": False,
                "top_logprobs": 0, "modalities": ["text"], "response_format": {"type": "text"}}  # fmt: skip


class ChatEndpoint:
    """The HTTP server, on an asyncio loop in a thread of its own.

    ``generate(prompt_ids, sampling, session_id)`` is awaited on that loop for each
    call (the rollout group's ``agenerate``). ``parser`` names the tool-call format
    of the model's text (``agent.parser``; None: no tool calls).
    """

    def __init__(
        self,
        generate: GenerateFn,
        tokenizer: PreTrainedTokenizerBase,
        *,
        parser: str | None = "hermes",
        model_name: str = "rlpost-policy",
        host: str = "127.0.0.1",
        port: int = 0,
    ):
        self.generate, self.tokenizer = generate, tokenizer
        self.parse = get_parser(parser) if parser is not None else None
        self.model_name, self.host, self.port = model_name, host, port
        self.sessions = SessionRegistry()
        self._chats: dict[str, ChatTokens] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._warned: set[str] = set()  # what was logged once

    # -- lifecycle ----------------------------------------------------------
    @property
    def url(self) -> str:
        """The OpenAI ``base_url``: ``http://host:port/v1``."""
        return f"{self.root_url}/v1"

    @property
    def root_url(self) -> str:
        """The Anthropic ``base_url`` (its client adds ``/v1/messages``): ``http://host:port``."""
        return f"http://{self.host}:{self.port}"

    def start(self) -> ChatEndpoint:
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._start_site())
            except BaseException as exc:  # handed to start()'s caller
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            if self._runner is not None:  # set once the site started
                loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=serve, name="rlpost-endpoint", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise OSError(
                f"the agent endpoint could not listen on {self.host}:{self.port} "
                f"({failure[0]}); set agent.endpoint_port to a free port, or 0 for any"
            ) from failure[0]
        return self

    async def _start_site(self) -> None:
        from aiohttp import web

        app = web.Application(client_max_size=64 * 1024**2)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        runner = self._runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        self.port = int(runner.addresses[0][1])

    def close(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    # -- handlers -----------------------------------------------------------
    async def _models(self, request: web.Request) -> web.Response:
        from aiohttp import web

        try:
            self._session(request)
        except RequestError as e:
            return web.json_response(e.body(), status=e.status)
        model = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "rlpost"}
        return web.json_response({"object": "list", "data": [model]})

    async def _not_found(self, request: web.Request) -> web.Response:
        from aiohttp import web

        e = RequestError(404, f"no route {request.method} {request.path}; this endpoint serves "
                         "POST /v1/chat/completions, /v1/responses, /v1/messages and GET /v1/models")  # fmt: skip
        return web.json_response(e.body(), status=404)

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        session = None
        try:
            session = self._session(request)
            body = await _json_body(request)
            refuse_unknown(body, CHAT_HONOURED, CHAT_HARMLESS, CHAT_NEUTRAL)
            reply = await self.complete(session, body)
        except RequestError as e:
            self._refused(session, e)
            return web.json_response(e.body(), status=e.status)
        if not body.get("stream"):
            return web.json_response(reply)
        return await self._stream(request, reply, body)

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        """Anthropic's ``POST /v1/messages``, answered as the chat completion it
        translates to (``anthropic_messages``)."""
        from aiohttp import web

        session = None
        try:
            session = self._session(request)
            body = await _json_body(request)
            reply, call = await self._complete(session, am.chat_request(body))
        except RequestError as e:
            self._refused(session, e)
            return web.json_response(am.error_body(e), status=e.status)
        message = am.message_reply(reply, None if call is None else call.stop)
        if not body.get("stream"):
            return web.json_response(message)
        return await _events(request, am.stream_events(message))

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        """OpenAI's ``POST /v1/responses``, answered as the chat completion it translates
        to (``openai_responses``); each response is kept for ``previous_response_id``."""
        from aiohttp import web

        session = None
        try:
            session = self._session(request)
            body = await _json_body(request)
            chat = ro.chat_request(body, session.responses)
            reply, _ = await self._complete(session, chat)
        except RequestError as e:
            self._refused(session, e)
            return web.json_response(e.body(), status=e.status)
        response_id = f"resp_{uuid.uuid4().hex}"
        messages = chat["messages"]
        assert isinstance(messages, list)
        session.responses.add(response_id, [*messages, reply["choices"][0]["message"]])
        response = ro.response_reply(reply, body, response_id)
        if not body.get("stream"):
            return web.json_response(response)
        return await _events(request, ro.stream_events(response))

    def _refused(self, session: Session | None, error: RequestError) -> None:
        """Count a request of ``session`` the endpoint refused (``agent/refused_requests``),
        and say once per parameter why: the agent sees the error, the run's log sees it
        too. A request without a valid key belongs to no episode and is not counted."""
        if session is None or error.status >= 500:
            return
        session.refused += 1
        param = error.param or "request"
        if f"refused {param}" not in self._warned:
            self._warned.add(f"refused {param}")
            log.warning("agent endpoint: refused a request (counted in agent/refused_requests, "
                        "the episode goes on as its program handles the error): %s", error)  # fmt: skip

    def _session(self, request: web.Request) -> Session:
        """The session of the request's key: ``Authorization: Bearer KEY`` (OpenAI's
        clients, Anthropic's) or ``x-api-key: KEY`` (Anthropic's API)."""
        auth = request.headers.get("Authorization", "")
        key = auth[7:].strip() if auth.startswith("Bearer ") else ""
        key = key or request.headers.get("x-api-key", "").strip()
        session = self.sessions.get(key) if key else None
        if session is None:
            raise RequestError(
                401,
                "unknown or expired API key: each episode's client has its own key, valid "
                "while the episode runs",
                code="invalid_api_key",
            )
        return session

    async def _stream(self, request: web.Request, reply: dict, body: dict) -> web.StreamResponse:
        from aiohttp import web

        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        choice = reply["choices"][0]
        base = {k: reply[k] for k in ("id", "created", "model")} | {
            "object": "chat.completion.chunk"
        }
        message = choice["message"]
        deltas: list[dict] = [{"role": "assistant", "content": message["content"]}]
        if message.get("tool_calls"):
            deltas.append(
                {"tool_calls": [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]}
            )
        chunks = [
            base | {"choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas
        ]
        chunks.append(
            base
            | {"choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]}
        )
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append(base | {"choices": [], "usage": reply["usage"]})
        for chunk in chunks:
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    # -- one call -----------------------------------------------------------
    async def complete(self, session: Session, body: dict) -> dict:
        """Answer one chat-completions request of ``session`` and record the call."""
        reply, _ = await self._complete(session, body)
        return reply

    async def _complete(self, session: Session, body: dict) -> tuple[dict, Call | None]:
        """The reply, and the call recorded (None: the session's budget was spent)."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError(400, "'messages' must be a non-empty list", "messages")
        msgs = [normalise_message(m, f"messages[{i}]") for i, m in enumerate(messages)]
        if body.get("n") not in (None, 1):
            raise RequestError(400, f"n={body['n']}: only n=1 is supported (one sample per call; "
                               "rollout.n sets the episodes per prompt)", "n")  # fmt: skip
        tools = body.get("tools") or None
        if tools is not None and not isinstance(tools, list):
            raise RequestError(400, "'tools' must be a list", "tools")
        choice = body.get("tool_choice", "auto")
        if choice not in ("auto", "none", None):
            raise RequestError(
                400, f"tool_choice={choice!r}: only 'auto' and 'none' are supported (the policy "
                "samples unconstrained)", "tool_choice",
            )  # fmt: skip
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        if limit is not None and (
            not isinstance(limit, int) or isinstance(limit, bool) or limit < 1
        ):
            raise RequestError(
                400, f"max_tokens={limit!r} must be a positive integer", "max_tokens"
            )
        stop = body.get("stop")
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if not all(isinstance(s, str) and s for s in stops):
            raise RequestError(
                400, "'stop' must be a string or a list of non-empty strings", "stop"
            )
        self._note_overrides(session, body)

        chat = self._chat(tools)
        prompt = self._prompt_ids(session, chat, msgs)
        limits, s = session.limits, session.sampling
        used = self._response_tokens(session, prompt)
        room = min(
            limit or limits.max_response_tokens,
            s.max_tokens,
            limits.max_response_tokens - used,
            limits.max_model_len - len(prompt),
        )
        if len(session.calls) >= limits.max_turns or room < 1:
            session.truncated = True
            return self._reply(body, "", None, "length", len(prompt), 0), None
        seed = None if s.seed is None else _seed(s.seed, session.index, len(session.calls))
        sampling = replace(s, n=1, max_tokens=room, seed=seed)
        try:
            completion = await self.generate(prompt, sampling, session.session_id)
        except Exception as exc:  # the engine's failure is the call's, not the server's
            log.warning(
                "agent endpoint: generation failed for session %s: %s", session.session_id, exc
            )
            raise RequestError(500, f"generation failed: {type(exc).__name__}: {exc}") from None
        call = self._record(session, chat, prompt, completion, msgs, stops, choice != "none")
        finish = "length" if call.finish_reason == "length" else "stop"
        if call.message.get("tool_calls"):
            finish = "tool_calls"
        reply = self._reply(
            body, call.message["content"], call.message, finish, len(prompt), len(call.sampled_ids)
        )
        return reply, call

    def _note_overrides(self, session: Session, body: dict) -> None:
        s = session.sampling
        keys = ("temperature", "top_p", "seed")
        asked = {k: body.get(k) for k in keys if body.get(k) is not None}
        if (
            asked.get("temperature", s.temperature) == s.temperature
            and asked.get("top_p", s.top_p) == s.top_p
            and "seed" not in asked  # each call's seed comes from trainer.seed
        ):
            return
        session.sampling_overridden += 1
        if "sampling" not in self._warned:
            self._warned.add("sampling")
            log.warning(
                "agent endpoint: a request asked for %s; the run samples at temperature=%s "
                "top_p=%s with a seed per call from trainer.seed (what the trainer's log-probs "
                "assume) and ignores the request's (counted in agent/sampling_overridden); set "
                "rollout.temperature / rollout.top_p to change them", asked, s.temperature, s.top_p,
            )  # fmt: skip

    def _chat(self, tools: list[dict] | None) -> ChatTokens:
        key = json.dumps(tools, sort_keys=True)
        if key not in self._chats:
            self._chats[key] = ChatTokens(self.tokenizer, tools)
        return self._chats[key]

    def _prompt_ids(self, session: Session, chat: ChatTokens, msgs: list[dict]) -> list[int]:
        """The previous prompt + sampled ids + the new messages' delta when the request
        continues the previous call's chat; else the chat rendered afresh."""
        if session.calls:
            last = session.calls[-1]
            history = [*last.request_messages, last.message]
            k = len(history)
            if len(msgs) > k and [comparable(m) for m in msgs[:k]] == [
                comparable(m) for m in history
            ]:
                end = chat.decode(last.sampled_ids[-1:]) if last.ended else None
                delta = chat.delta_ids(history, msgs[k:], end)
                return last.prompt_ids + last.sampled_ids + delta
        return chat.prompt_ids(msgs)

    def _response_tokens(self, session: Session, prompt: list[int]) -> int:
        """Tokens after the current segment's first prompt: what the budget counts."""
        if session.calls:
            last = session.calls[-1]
            previous = last.prompt_ids + last.sampled_ids
            if prompt[: len(previous)] == previous:
                return len(prompt) - session.segment_start
        session.segment_start = len(prompt)  # a new segment starts here
        return 0

    def _record(
        self,
        session: Session,
        chat: ChatTokens,
        prompt: list[int],
        completion: Completion,
        msgs: list[dict],
        stops: list[str],
        tools_on: bool,
    ) -> Call:
        sampled = list(completion.token_ids)
        logps = list(completion.logprobs)
        versions = list(completion.versions or [-1] * len(sampled))
        ended = completion.finish_reason == "stop" and bool(sampled)
        text = chat.decode(sampled[:-1] if ended else sampled)
        cut = _stop_cut(chat, sampled, text, stops)
        if cut is not None:
            keep, text, _ = cut
            sampled, logps, versions, ended = sampled[:keep], logps[:keep], versions[:keep], False
        parsed = (
            self.parse(text) if (self.parse is not None and tools_on) else ParsedTurn(content=text)
        )
        message = assistant_message(parsed)
        if message.pop("tool_call_errors", None):  # as OpenAI servers do: the raw text
            message["content"] = text
        call = Call(
            prompt_ids=prompt, sampled_ids=sampled, logprobs=logps, versions=versions,
            finish_reason="stop" if cut is not None else completion.finish_reason, ended=ended,
            text=text, message=message, request_messages=msgs,
            tool_calls=len(parsed.tool_calls), tool_errors=len(parsed.errors),
            stop=None if cut is None else cut[2],
        )  # fmt: skip
        session.calls.append(call)
        return call

    def _reply(
        self, body: dict, content: str, message: dict | None, finish: str, prompt: int, sampled: int
    ) -> dict:
        out: dict[str, object] = {"role": "assistant", "content": content}
        if message is not None and message.get("tool_calls"):
            out["tool_calls"] = openai_tool_calls(message)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(body.get("model") or self.model_name),
            "choices": [{"index": 0, "message": out, "finish_reason": finish, "logprobs": None}],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": sampled,
                "total_tokens": prompt + sampled,
            },
        }


async def _events(request: web.Request, events: list[tuple[str, dict]]) -> web.StreamResponse:
    """``events`` sent as named server-sent events (Anthropic's and the Responses API's form)."""
    from aiohttp import web

    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for event, data in events:
        await response.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
    await response.write_eof()
    return response


async def _json_body(request: web.Request) -> dict:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(400, f"the request body is not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    return body


def _stop_cut(
    chat: ChatTokens, sampled: list[int], text: str, stops: list[str]
) -> tuple[int, str, str] | None:
    """``(ids to keep, text before the stop, the stop)`` for the earliest stop string
    in ``text``: the fewest sampled ids whose decoding holds it. None when no stop
    string occurs."""
    hits = [(text.find(s), s) for s in stops if s in text]
    if not hits:
        return None
    at, stop = min(hits)
    for keep in range(1, len(sampled) + 1):
        if chat.decode(sampled[:keep]).find(stop) == at:
            return keep, text[:at], stop
    return len(sampled), text[:at], stop
