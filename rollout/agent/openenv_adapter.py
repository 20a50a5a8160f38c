"""OpenEnv environments (``openenv-core``) behind rlpost's ``reset(row)`` / ``step(message)``.

An OpenEnv environment runs as a server (``openenv.core.env_server.create_app``,
served by uvicorn, a container or a Space); each episode is one session on it, a
WebSocket that OpenEnv's own client opens. ``agent.env`` names it either way:

- ``openenv:<url>`` (``http://host:port``, ``https://``, ``ws://``, ``wss://``):
  OpenEnv's ``GenericEnvClient``, actions and observations as plain JSON.
- ``openenv:<module or file.py>:<client class>`` with ``agent.env_kwargs.base_url``:
  the environment's own ``EnvClient`` subclass, as TRL's OpenEnv examples use it
  (``EchoEnv(base_url=...)``); the action is its ``EnvClient[Action, ...]`` class.

Either way the server is asked for its ``/schema`` when the run starts, so a
server that is not up, or an action rlpost cannot build, is a config error
before anything loads.

The episode: ``reset(seed=..., **columns)`` gets the row's ``seed`` column (or,
without one, a hash of its prompt, so a row's ``rollout.n`` episodes play the
same game) and its other columns but ``prompt`` (the server passes on those its
``reset`` names, all of them with ``**kwargs``); the observation's text is
appended to the prompt's last user message. Each model turn's whole text is the
action's ``action_field`` (by default the action's only text field), the other
fields from ``action_defaults``; the next user message is the observation's
text: its ``observation_field`` (by default its only text field), or else all
its fields as JSON. The episode's reward is the sum of its steps' rewards
(``reward=last``: the last one), a step without one counting 0.

A step the server refuses (an action that does not validate, an environment
whose ``step`` raised) is answered with the error as the next user message; a
lost connection or a step past ``timeout_s`` ends the episode. Both count in
``agent/tool_errors`` / ``agent/tool_timeouts``. A server at its session limit
(``max_concurrent_envs``) is waited for, ``session_wait_s`` at most.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, get_args, get_origin

from rlpost.rollout.agent.env_base import EnvError, StepResult, prompt_messages
from rlpost.rollout.agent.json_types import JSONObject
from rlpost.rollout.agent.parsers import ToolCall
from rlpost.rollout.agent.specs import load_object
from rlpost.rollout.agent.tools import Status, ToolOutcome

if TYPE_CHECKING:
    from pydantic import BaseModel

URL_SCHEMES = ("http://", "https://", "ws://", "wss://")
# agent.env_kwargs an OpenEnv environment takes (docs/agents.md says what each does)
OPTIONS = (
    "base_url", "action_field", "action_defaults", "observation_field", "reward", "timeout_s",
    "session_wait_s",
)  # fmt: skip
DEFAULTS = {"reward": "sum", "timeout_s": 60.0, "session_wait_s": 300.0}
SERVER_FIELDS = {"done", "reward", "metadata"}  # every observation's, not the model's


@dataclass(frozen=True)
class OpenEnvSettings:
    """What every episode of one ``agent.env`` shares, checked once."""

    url: str
    client_cls: type
    action_cls: type | None  # the typed client's action model; None: a JSON dict
    action_field: str
    action_defaults: dict[str, object]
    observation_field: str | None  # None: the observation's fields as JSON
    reward: str  # "sum" or "last"
    timeout_s: float
    session_wait_s: float


class OpenEnvStep(Protocol):
    """What OpenEnv's ``StepResult`` holds: the observation (a typed client's model,
    else plain JSON), the step's reward and whether the episode is done."""

    @property
    def observation(self) -> BaseModel | Mapping[str, object]: ...

    @property
    def reward(self) -> float | None: ...

    @property
    def done(self) -> bool: ...


class OpenEnvSession(Protocol):
    """An OpenEnv ``EnvClient``, as an episode uses it: one session on the server."""

    async def reset(self, **kwargs: object) -> OpenEnvStep: ...

    async def step(self, action: object) -> OpenEnvStep: ...

    async def disconnect(self) -> None: ...


class OpenEnvEnv:
    """One session on an OpenEnv server per episode (see the module docstring)."""

    def __init__(self, settings: OpenEnvSettings):
        self.settings = settings
        self.client: OpenEnvSession | None = None
        self.reward = 0.0
        self.outcomes: list[ToolOutcome] = []

    async def reset(self, row: dict) -> list[dict]:
        seed = row.get("seed")
        if seed is None:
            digest = hashlib.blake2b(repr(row.get("prompt")).encode(), digest_size=4).digest()
            seed = int.from_bytes(digest, "little")
        columns = {k: v for k, v in row.items() if k not in ("prompt", "seed")}
        result = await self._open({**columns, "seed": int(seed)})
        messages = [dict(m) for m in prompt_messages(row)]
        text = observation_text(result.observation, self.settings.observation_field)
        users = [m for m in messages if m.get("role") == "user"]
        if text and users:
            users[-1]["content"] = f"{users[-1]['content']}\n\n{text}"
        elif text:
            messages.append({"role": "user", "content": text})
        return messages

    async def _open(self, reset_kwargs: dict[str, object]) -> OpenEnvStep:
        from websockets.exceptions import ConnectionClosed

        s = self.settings
        deadline, delay = time.monotonic() + s.session_wait_s, 0.05
        while True:
            client: OpenEnvSession = s.client_cls(base_url=s.url, message_timeout_s=s.timeout_s)
            try:
                result = await client.reset(**reset_kwargs)
            except Exception as exc:  # retried while the server is full; else named
                await client.disconnect()
                # A full server answers CAPACITY_REACHED and closes the connection; the
                # close may come first.
                full = "CAPACITY_REACHED" in str(exc)
                closed = isinstance(exc, ConnectionClosed)
                if (full or closed) and time.monotonic() < deadline:
                    await asyncio.sleep(delay)
                    delay = min(2 * delay, 1.0)
                    continue
                wait = f"for agent.env_kwargs.session_wait_s={s.session_wait_s}"
                if full:
                    hint = f"it stayed at its session limit {wait}; raise its max_concurrent_envs"
                elif closed:
                    hint = (
                        f"it kept closing new sessions at once {wait} (at its session limit, or "
                        "its environment fails to start: see the server's log)"
                    )
                else:
                    hint = "is the server running?"
                raise EnvError(
                    f"OpenEnv server {s.url}: cannot open a session ({type(exc).__name__}: "
                    f"{exc}); {hint}"
                ) from None
            self.client = client  # an episode cut short is closed by the loop (close())
            return result

    async def step(self, message: dict) -> StepResult:
        from pydantic import ValidationError

        s = self.settings
        text = message.get("text", message.get("content") or "")
        start = time.monotonic()
        try:
            assert self.client is not None, "a step after the session closed"
            fields = {**s.action_defaults, s.action_field: text}
            result = await self.client.step(
                fields if s.action_cls is None else s.action_cls(**fields)
            )
        except (ValidationError, RuntimeError) as exc:
            if isinstance(exc, RuntimeError) and not str(exc).startswith("Server error"):
                raise
            # the action was refused or the environment's step raised: the session goes on
            error = str(exc).removeprefix("Server error: ")
            self._count("error", error, start)
            return [{"role": "user", "content": f"Error: {error}"}], False, self.reward
        except Exception as exc:  # a lost connection, a timeout: the episode ends, counted
            await self.close()
            timeout = isinstance(exc, TimeoutError)
            self._count("timeout" if timeout else "error", f"{type(exc).__name__}: {exc}", start)
            return [], True, self.reward
        reward = 0.0 if result.reward is None else float(result.reward)
        self.reward = self.reward + reward if s.reward == "sum" else reward
        if result.done:
            await self.close()
            return [], True, self.reward
        content = observation_text(result.observation, s.observation_field)
        return [{"role": "user", "content": content}], False, self.reward

    def _count(self, status: Status, text: str, start: float) -> None:
        call = ToolCall("openenv_step", {}, f"step-{len(self.outcomes)}")
        self.outcomes.append(ToolOutcome(call, status, text, time.monotonic() - start))

    async def close(self) -> None:
        """End the episode's session (done; also safe to call again)."""
        client, self.client = self.client, None
        if client is not None:
            await client.disconnect()


def observation_text(observation: BaseModel | Mapping[str, object], field: str | None) -> str:
    """What the model reads of an observation: ``field``'s value, or all its fields
    (but done, reward and metadata) as JSON."""
    if hasattr(observation, "model_dump"):
        fields = observation.model_dump(exclude=SERVER_FIELDS)
    else:
        fields = {k: v for k, v in dict(observation).items() if k not in SERVER_FIELDS}
    value = fields.get(field) if field is not None else fields
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


# -- the factory: spec, options and the server's schema, checked once ----------------
def openenv_factory(
    spec: str,
    ident: str,
    kwargs: Mapping[str, Any],  # agent.env_kwargs: plain config values
) -> Callable[[], OpenEnvEnv]:
    """``agent.env=openenv:<ident>``: a factory of ``OpenEnvEnv``s, or an ``EnvError``
    naming every problem of the spec and its ``agent.env_kwargs``."""
    try:
        from openenv.core import EnvClient, GenericEnvClient
    except ImportError as exc:
        raise EnvError(
            f"environment {spec!r} needs the openenv-core package ({exc}); "
            "pip install 'rlpost[openenv]'"
        ) from None
    kwargs = dict(kwargs)
    options = {**DEFAULTS, **kwargs}
    problems = []
    unknown = sorted(set(kwargs) - set(OPTIONS))
    if unknown:
        problems.append(
            f"agent.env_kwargs takes {', '.join(OPTIONS)} for an OpenEnv environment, not {unknown}"
        )
    if options["reward"] not in ("sum", "last"):
        problems.append(f"agent.env_kwargs.reward={options['reward']}: takes sum or last")
    for key in ("timeout_s", "session_wait_s"):
        value = options[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            problems.append(f"agent.env_kwargs.{key}={value!r}: takes seconds, a number >= 0")
    defaults = kwargs.get("action_defaults") or {}
    if not isinstance(defaults, Mapping):
        problems.append(f"agent.env_kwargs.action_defaults={defaults!r}: takes a mapping")
        defaults = {}
    action_cls: type | None = None
    if ident.startswith(URL_SCHEMES):
        url, client_cls = ident, GenericEnvClient
        if "base_url" in kwargs:
            problems.append(
                f"agent.env_kwargs.base_url: the spec already names the server ({ident}); drop one"
            )
    else:
        client_cls = _client_class(spec, ident, EnvClient)
        action_cls = _action_class(client_cls, EnvClient)
        url = str(kwargs.get("base_url") or "")
        if not url.startswith(URL_SCHEMES):
            problems.append(
                f"agent.env_kwargs.base_url={url or None}: the client class needs the "
                "server's URL (http://host:port)"
            )
        if action_cls is None:
            problems.append(
                f"{client_cls.__name__} does not name its action class "
                "(class X(EnvClient[Action, Observation, State])); name it, or use "
                "agent.env=openenv:<url>"
            )
        try:
            inspect.signature(client_cls).bind(base_url=url, message_timeout_s=options["timeout_s"])
        except TypeError as e:
            problems.append(f"{client_cls.__name__}(base_url, message_timeout_s): {e}")
    if problems:
        raise EnvError(f"environment {spec!r}: " + "; ".join(problems))
    url = url.rstrip("/")
    schema = fetch_schema(spec, url)
    problems = []
    action_field = _action_field(schema["action"], kwargs.get("action_field"), defaults, problems)
    observation_field = _observation_field(
        schema["observation"], kwargs.get("observation_field"), problems
    )
    if problems:
        raise EnvError(f"environment {spec!r} (server {url}): " + "; ".join(problems))
    settings = OpenEnvSettings(
        url=url, client_cls=client_cls, action_cls=action_cls, action_field=action_field,
        action_defaults=dict(defaults), observation_field=observation_field,
        reward=options["reward"], timeout_s=float(options["timeout_s"]),
        session_wait_s=float(options["session_wait_s"]),
    )  # fmt: skip
    return lambda: OpenEnvEnv(settings)


def _client_class(spec: str, ident: str, env_client: type) -> type:
    from openenv.core.env_server import Environment

    cls = load_object(ident, "environment", EnvError)
    if isinstance(cls, type) and issubclass(cls, env_client):
        return cls
    if isinstance(cls, type) and issubclass(cls, Environment):
        raise EnvError(
            f"environment {spec!r}: {cls.__name__} is the server side of an OpenEnv "
            "environment; serve it (uvicorn on openenv.core.env_server.create_app("
            f"{cls.__name__}, <Action>, <Observation>)) and use agent.env=openenv:http://host:port, "
            "or name its EnvClient class with agent.env_kwargs.base_url"
        )
    raise EnvError(
        f"environment {spec!r}: {cls!r} is not an OpenEnv EnvClient class; use "
        "openenv:http://host:port or openenv:<module>:<EnvClient subclass>"
    )


def _action_class(cls: type, env_client: type) -> type | None:
    """``Action`` of ``class Client(EnvClient[Action, Observation, State])``."""
    from pydantic import BaseModel

    for klass in cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            args = get_args(base)
            origin = get_origin(base)
            if origin is not None and issubclass(origin, env_client) and args:
                if isinstance(args[0], type) and issubclass(args[0], BaseModel):
                    return args[0]
    return None


def fetch_schema(spec: str, url: str) -> JSONObject:
    """The server's ``/schema``: the JSON schemas of its action and observation."""
    http = url.replace("ws://", "http://", 1).replace("wss://", "https://", 1)
    try:
        with urllib.request.urlopen(f"{http}/schema", timeout=10) as response:
            schema = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise EnvError(
            f"environment {spec!r}: cannot read the OpenEnv server's schema at {http}/schema "
            f"({type(exc).__name__}: {exc}); start the server or fix the URL"
        ) from None
    if not isinstance(schema, dict) or not {"action", "observation"} <= set(schema):
        raise EnvError(
            f"environment {spec!r}: {http}/schema has no action and observation schemas; "
            "is it an OpenEnv server?"
        )
    return schema


def _is_text(prop: JSONObject) -> bool:
    return prop.get("type") == "string" or any(
        p.get("type") == "string" for p in prop.get("anyOf", [])
    )


def _action_field(
    schema: JSONObject, field: str | None, defaults: Mapping[str, object], problems: list[str]
) -> str:
    props = {k: v for k, v in schema.get("properties", {}).items() if k != "metadata"}
    required = set(schema.get("required", []))
    title = schema.get("title", "the action")
    described = ", ".join(f"{k} ({v.get('type', 'any')})" for k, v in props.items())
    if field is None:
        text = [k for k in props if _is_text(props[k])]
        candidates = [k for k in text if k in required] or text
        if len(candidates) != 1:
            problems.append(
                f"{title} has fields {described}: name the one that gets the model's text "
                "with agent.env_kwargs.action_field=<field> (the others: "
                "agent.env_kwargs.action_defaults)"
            )
            return ""
        field = candidates[0]
    elif field not in props:
        problems.append(f"agent.env_kwargs.action_field={field}: {title} has fields {described}")
    unknown = sorted(set(defaults) - set(props))
    if unknown:
        problems.append(f"agent.env_kwargs.action_defaults: {title} has no fields {unknown}")
    unset = sorted(required - {field} - set(defaults))
    if unset:
        problems.append(
            f"{title} requires {unset} besides {field}: give them with "
            "agent.env_kwargs.action_defaults.<field>=<value>"
        )
    return field


def _observation_field(schema: JSONObject, field: str | None, problems: list[str]) -> str | None:
    props = {k: v for k, v in schema.get("properties", {}).items() if k not in SERVER_FIELDS}
    if field is not None:
        if field not in props:
            title = schema.get("title", "the observation")
            problems.append(
                f"agent.env_kwargs.observation_field={field}: {title} has fields {sorted(props)}"
            )
        return field
    text = [k for k in props if _is_text(props[k])]
    return text[0] if len(text) == 1 else None
