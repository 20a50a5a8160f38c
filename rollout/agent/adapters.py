"""Environments of other libraries behind rlpost's ``reset(row)`` / ``step(message)``.

Chosen by a prefix on ``agent.env`` (see ``env.load_env``):

- ``skyrl_gym:<env id>``: ``skyrl_gym.make(id, env_config=..., extras=...)`` per
  episode. ``env_config`` is ``agent.env_kwargs.env_config``; ``extras`` are the
  row's columns other than ``prompt`` (SkyRL's dataset rows carry
  ``reward_spec`` and ``extra_info`` there) over ``agent.env_kwargs.extras``.
  ``init(prompt)`` opens the chat; ``step(text)`` answers each model turn with
  its observations (messages), reward and done.
- ``textarena:<game id>``: a single-player TextArena game, ``ta.make(id)``,
  ``reset(num_players=1, seed=...)``. The game's observation is the chat's user
  message; its seed is the row's ``seed`` column (or, without one, a hash of the
  row's prompt), so the ``rollout.n`` episodes of a row play the same game. Each
  model turn is the game's action; the next user message is what the game
  added to its observation. At the end, ``close()``'s reward for the player is
  the episode's reward; a game cut short (``agent.max_turns``) scores 0.
- A class in the shape of TRL's ``environment_factory`` (``agent.env=file.py:Class``
  without a ``step`` method): one instance per episode; ``reset(**columns)`` gets
  the row's columns it names (all of them with ``**kwargs``) and a string it
  returns is appended to the prompt's last user message; its other public
  methods are the tools (type hints and a docstring, as any rlpost tool), run
  in the episode one call at a time, since they share the instance's state; the
  episode ends when the model answers without a tool call, and its reward is
  the instance's ``reward`` attribute then (``None``: ``reward.fn`` scores).
- ``openenv:<url>`` or ``openenv:<module>:<client class>``: an OpenEnv server, one
  session per episode (``openenv_adapter.py``).

Each library is an optional extra; a missing one, or an id the library does not
know, is an ``EnvError`` naming what to install or change.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import inspect
from collections.abc import Awaitable, Callable, Mapping
from types import ModuleType
from typing import Any, Protocol

from rlpost.rollout.agent.env_base import (
    EnvError,
    EnvFactory,
    StepResult,
    prompt_messages,
    tool_calls_of,
    tool_replies,
)
from rlpost.rollout.agent.openenv_adapter import openenv_factory
from rlpost.rollout.agent.tool_schema import SchemaError, tool_schema
from rlpost.rollout.agent.tools import Tool, ToolOutcome, run_tool_calls

EXTRAS = {"skyrl_gym": "skyrl-gym", "textarena": "textarena"}


def _import(library: str, spec: str) -> ModuleType:
    try:
        return importlib.import_module(library)
    except ImportError as exc:
        raise EnvError(
            f"environment {spec!r} needs the {EXTRAS[library]} package ({exc}); "
            f"pip install 'rlpost[{EXTRAS[library]}]'"
        ) from None


def _unknown(spec: str, kind: str, ident: str, known: list[str]) -> EnvError:
    import difflib

    close = difflib.get_close_matches(ident, known, n=3)
    hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(known[:40])}"
    return EnvError(f"environment {spec!r}: {kind} has no environment {ident!r}; {hint}")


# -- skyrl-gym --------------------------------------------------------------------
class SkyRLGymEnv:
    """One skyrl-gym environment per episode, made at ``reset`` from the row's extras."""

    def __init__(self, env_id: str, env_config: Mapping[str, object], extras: Mapping[str, object]):
        self.env_id, self.env_config, self.extras = env_id, dict(env_config), dict(extras)
        self.env: Any = None  # skyrl-gym's, made at reset (an optional package)

    def reset(self, row: dict) -> list[dict]:
        import skyrl_gym

        extras = {**self.extras, **{k: v for k, v in row.items() if k != "prompt"}}
        self.env = skyrl_gym.make(self.env_id, env_config=self.env_config, extras=extras)
        messages, _info = self.env.init(prompt_messages(row))
        return [dict(m) for m in messages]

    def step(self, message: dict) -> StepResult:
        out = self.env.step(message.get("text", message.get("content") or ""))
        done = bool(out["done"])
        if done and hasattr(self.env, "close"):
            self.env.close()
        reward = out.get("reward")
        return (
            [dict(m) for m in out.get("observations") or []],
            done,
            (None if reward is None else float(reward)),
        )


def skyrl_gym_factory(
    spec: str,
    env_id: str,
    kwargs: Mapping[str, Any],  # agent.env_kwargs: plain config values
) -> Callable[[], SkyRLGymEnv]:
    skyrl_gym = _import("skyrl_gym", spec)
    known = sorted(skyrl_gym.envs.registration.registry.keys())
    if env_id not in known:
        raise _unknown(spec, "skyrl-gym", env_id, known)
    extra = sorted(set(kwargs) - {"env_config", "extras"})
    if extra:
        raise EnvError(
            f"environment {spec!r}: agent.env_kwargs takes env_config and extras for a "
            f"skyrl-gym environment, not {extra}"
        )
    config, extras = kwargs.get("env_config") or {}, kwargs.get("extras") or {}
    return lambda: SkyRLGymEnv(env_id, config, extras)


# -- TextArena --------------------------------------------------------------------
class TextArenaEnv:
    """A single-player TextArena game per episode."""

    def __init__(self, game_id: str, kwargs: Mapping[str, object]):
        self.game_id, self.kwargs = game_id, dict(kwargs)
        self.env: Any = None  # TextArena's, made at reset (an optional package)
        self.seen = ""

    def reset(self, row: dict) -> list[dict]:
        import textarena as ta

        seed = row.get("seed")
        if seed is None:
            digest = hashlib.blake2b(repr(row.get("prompt")).encode(), digest_size=4).digest()
            seed = int.from_bytes(digest, "little")
        self.env = ta.make(self.game_id, **self.kwargs)
        self.env.reset(num_players=1, seed=int(seed))
        return [{"role": "user", "content": self._new_observation()}]

    def _new_observation(self) -> str:
        _, observation = self.env.get_observation()
        text = observation if isinstance(observation, str) else str(observation)
        new = text[len(self.seen) :] if text.startswith(self.seen) else text
        self.seen = text
        return new.strip()

    def step(self, message: dict) -> StepResult:
        done, _info = self.env.step(message.get("text", message.get("content") or ""))
        if done:
            rewards, _ = self.env.close()
            reward = (rewards or {}).get(0)
            return [], True, None if reward is None else float(reward)
        # 0 until the game ends: an episode cut before the end (agent.max_turns) scores 0
        return [{"role": "user", "content": self._new_observation()}], False, 0.0


def textarena_factory(
    spec: str, game_id: str, kwargs: Mapping[str, object]
) -> Callable[[], TextArenaEnv]:
    _import("textarena", spec)
    from textarena.envs.registration import ENV_REGISTRY

    if game_id not in ENV_REGISTRY:
        raise _unknown(spec, "TextArena", game_id, sorted(ENV_REGISTRY))
    return lambda: TextArenaEnv(game_id, kwargs)


LIBRARIES: dict[str, Callable[[str, str, Mapping[str, object]], EnvFactory]] = {
    "skyrl_gym": skyrl_gym_factory,
    "textarena": textarena_factory,
    "openenv": openenv_factory,
}


# -- TRL-style environment classes ----------------------------------------------
def is_trl_style(cls: type) -> bool:
    """A class in the shape of TRL's ``environment_factory``: ``reset``, no ``step``, and
    public methods (its tools)."""
    if not callable(getattr(cls, "reset", None)) or callable(getattr(cls, "step", None)):
        return False
    return any(
        callable(v) and not k.startswith("_") and k != "reset" for k, v in inspect.getmembers(cls)
    )


class TrlStyleInstance(Protocol):
    """An instance of a TRL-style environment class: ``reset`` takes the row's columns
    it names and may return text; its other public methods are its tools."""

    reset: Callable[..., object]


class TrlStyleEnv:
    """Wraps an instance of a TRL-style environment class (see the module docstring)."""

    def __init__(self, env: TrlStyleInstance, timeout_s: float = 30.0):
        self.env, self.timeout_s = env, timeout_s
        self.tools = method_tools(env)
        self.tool_schemas = [t.schema for t in self.tools.values()]
        self.outcomes: list[ToolOutcome] = []

    def reset(self, row: dict) -> list[dict]:
        self.outcomes = []
        params = inspect.signature(self.env.reset).parameters.values()
        if any(p.kind is p.VAR_KEYWORD for p in params):
            text = self.env.reset(**row)
        else:
            names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
            text = self.env.reset(**{k: v for k, v in row.items() if k in names})
        messages = [dict(m) for m in prompt_messages(row)]
        if isinstance(text, str) and text:
            users = [m for m in messages if m.get("role") == "user"]
            if users:
                users[-1]["content"] = f"{users[-1]['content']}\n\n{text}"
            else:
                messages.append({"role": "user", "content": text})
        return messages

    async def step(self, message: dict) -> StepResult:
        calls = tool_calls_of(message)
        errors = message.get("tool_call_errors") or []
        if not calls and not errors:
            reward = getattr(self.env, "reward", None)
            return [], True, None if reward is None else float(reward)
        outcomes = []
        for call in calls:  # one at a time: the methods share the instance's state
            outcomes += await run_tool_calls([call], self.tools, self.timeout_s)
        self.outcomes += outcomes
        return tool_replies(outcomes, errors), False, None


def method_tools(env: object) -> dict[str, Tool]:
    """The public methods of ``env`` (all but ``reset``) as tools, run in a thread."""
    tools: dict[str, Tool] = {}
    problems = []
    for name, method in inspect.getmembers(env, inspect.ismethod):
        if name.startswith("_") or name == "reset":
            continue
        try:
            schema = tool_schema(method)
        except SchemaError as e:
            problems.append(f"{type(env).__name__}.{name}: {e}")
            continue
        tools[name] = Tool(name, _threaded(method), schema, f"<method {name}>", is_async=True)
    if problems:
        raise EnvError(
            "a TRL-style environment's public methods are its tools and need type hints and a "
            "docstring (or a leading underscore to keep them private): " + "; ".join(problems)
        )
    return tools


def _threaded(method: Callable[..., object]) -> Callable[..., Awaitable[object]]:
    if inspect.iscoroutinefunction(method):
        return method

    async def call(**arguments: object) -> object:
        return await asyncio.to_thread(method, **arguments)

    return call
