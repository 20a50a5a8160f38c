"""Environments: what answers the model between its turns.

An environment is any object with

    reset(row) -> list[dict]                      # the messages that open the episode
    step(message) -> (new_messages, done, reward)  # answer one assistant message

either of which may be ``async``. ``message`` is the assistant's turn,
``{"role": "assistant", "content": str, "tool_calls": [...], "text": str}`` (tool calls in the
OpenAI form ``{"id", "type": "function", "function": {"name", "arguments"}}``,
plus ``"tool_call_errors"`` when some call blocks were malformed; ``text`` is the
turn's whole sampled text, tool-call blocks included, which environments that
parse the model's text themselves read). ``reward`` is
``None`` or a float; the episode keeps the last one that is not ``None``. The loop
creates one environment per episode. Two optional attributes: ``tool_schemas``
(given to the chat template as ``tools``) and ``outcomes`` (``ToolOutcome`` list,
counted into the episode's tool errors and timeouts).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import random
from collections.abc import Callable, Mapping, Sequence

from rlpost.rollout.agent.env_base import (  # noqa: F401 (re-exported)
    Env,
    EnvError,
    EnvFactory,
    StepResult,
    prompt_messages,
    tool_calls_of,
    tool_replies,
)
from rlpost.rollout.agent.mcp_tools import EpisodeSessions, McpServer, McpToolFn, RunSessions
from rlpost.rollout.agent.specs import SPEC_FORMS, load_object
from rlpost.rollout.agent.tool_pool import ToolWorkerPool
from rlpost.rollout.agent.tools import (
    Tool,
    ToolOutcome,
    load_tools,
    run_tool_calls,
    tool_from_function,
)

log = logging.getLogger(__name__)


class ToolEnv:
    """The default environment: run the assistant's tool calls and answer with their
    results, one ``{"role": "tool", "name", "content", "tool_call_id"}`` message per
    call (malformed call blocks get an error message each). Done when the assistant
    answers without calling a tool. No reward: reward functions score the final text.

    ``tools`` are specs (built-in names, ``file.py:fn``, ``module:fn``), functions or
    ``Tool``s, or a ready ``{name: Tool}`` map.
    """

    def __init__(
        self,
        tools: Sequence[str | Tool | Callable[..., object]] | Mapping[str, Tool],
        timeout_s: float = 30.0,
        pool: ToolWorkerPool | None = None,
        latency_s: tuple[float, float] | None = None,
        seed: int = 0,
        mcp_sessions: str = "episode",
    ):
        """``latency_s``: each turn that calls tools first waits a uniform random time
        in ``[lo, hi]`` seconds (a slow tool or API, for benchmarks), drawn from a
        generator seeded ``seed``. ``mcp_sessions``: ``episode`` (a session per
        episode and MCP server) or ``run`` (one per server, shared; mcp_tools)."""
        self.tools = dict(tools) if isinstance(tools, Mapping) else _as_tools(tools)
        # MCP servers' tools call through this episode's own sessions (mcp_tools).
        self._mcp_servers = {
            name: t.fn.server for name, t in self.tools.items() if isinstance(t.fn, McpToolFn)
        }
        sessions = RunSessions if mcp_sessions == "run" else EpisodeSessions
        self.mcp = sessions() if self._mcp_servers else None
        if self.mcp is not None:
            for name, tool in list(self.tools.items()):
                if isinstance(tool.fn, McpToolFn):
                    self.tools[name] = dataclasses.replace(tool, fn=self.mcp.bind(tool.fn))
        self.timeout_s = timeout_s
        self.pool = pool
        self.latency_s = latency_s
        self._rng = random.Random(seed)
        self.tool_schemas = [t.schema for t in self.tools.values()]
        self.outcomes: list[ToolOutcome] = []

    def reset(self, row: dict) -> list[dict]:
        self.outcomes = []
        return prompt_messages(row)

    async def step(self, message: dict) -> StepResult:
        calls = tool_calls_of(message)
        errors = message.get("tool_call_errors") or []
        if not calls and not errors:
            return [], True, None
        if self.latency_s is not None and calls:
            await asyncio.sleep(self._rng.uniform(*self.latency_s))
        if self.mcp is not None:
            await self._open_mcp(
                {self._mcp_servers[c.name] for c in calls if c.name in self._mcp_servers}
            )
        outcomes = await run_tool_calls(calls, self.tools, self.timeout_s, self.pool)
        self.outcomes += outcomes
        return tool_replies(outcomes, errors), False, None

    async def _open_mcp(self, servers: set[McpServer]) -> None:
        """This episode's sessions with ``servers``, opened here, in the episode's task;
        one that fails to open leaves its calls to fail on their own, as a tool error."""
        assert self.mcp is not None
        try:  # (no timeout scope around it: the sessions it opens outlive the call)
            await self.mcp.open(servers)
        except Exception as exc:  # noqa: BLE001 - the calls report it to the model
            log.warning("agent.tools: an MCP session could not be opened (%s: %s)",
                        type(exc).__name__, exc)  # fmt: skip

    async def close(self) -> None:
        """End the episode's MCP sessions (a server script it started stops)."""
        if self.mcp is not None:
            await self.mcp.aclose()


def _as_tools(items: Sequence[str | Tool | Callable[..., object]]) -> dict[str, Tool]:
    specs = [t for t in items if isinstance(t, str)]
    tools = load_tools(specs)
    for item in items:
        if isinstance(item, str):
            continue
        tool = item if isinstance(item, Tool) else tool_from_function(item)
        if tool.name in tools:
            raise EnvError(f"two tools are named {tool.name!r}; tool names must be unique")
        tools[tool.name] = tool
    return tools


# name -> environment class, for ``load_env``; users add theirs by spec.
ENVS: dict[str, type] = {"tools": ToolEnv}


def load_env(spec: str, kwargs: Mapping[str, object] | None = None) -> EnvFactory:
    """A factory of fresh environments (one per episode): ``cls(**kwargs)`` for the class
    ``spec`` names (a name in ``ENVS``, ``file.py:Class`` or ``module:Class``).

    The class and ``kwargs`` are checked now, so a bad config fails before any model
    loads: not loadable, not a class, no ``reset`` / ``step`` method, or ``kwargs``
    that its constructor does not take.
    """
    from rlpost.rollout.agent import adapters

    library, _, ident = spec.partition(":")
    if library in adapters.LIBRARIES and ident:
        return adapters.LIBRARIES[library](spec, ident, dict(kwargs or {}))
    cls: object
    if spec in ENVS:
        cls = ENVS[spec]
    elif ":" in spec:
        cls = load_object(spec, "environment", EnvError)
    else:
        raise EnvError(
            f"environment {spec!r} is not built in ({sorted(ENVS)}); use a built-in name "
            f"or {SPEC_FORMS}"
        )
    if not isinstance(cls, type):
        raise EnvError(
            f"environment {spec!r}: is a {type(cls).__name__}, not a class; point the spec at "
            "a class with reset(row) and step(message) methods"
        )
    if adapters.is_trl_style(cls):  # TRL's environment_factory shape: methods are tools
        return _trl_style_factory(spec, cls, dict(kwargs or {}))
    missing = [m for m in ("reset", "step") if not callable(getattr(cls, m, None))]
    if missing:
        raise EnvError(
            f"environment {spec!r}: class {cls.__name__} lacks {' and '.join(missing)}; "
            "an environment needs reset(row) -> messages and "
            "step(message) -> (messages, done, reward)"
        )
    kwargs = dict(kwargs or {})
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as e:
        raise EnvError(
            f"environment {spec!r}: {cls.__name__}({', '.join(kwargs)}) does not match its "
            f"constructor {cls.__name__}{inspect.signature(cls)} ({e}); fix the env kwargs"
        ) from None

    def make() -> Env:
        return cls(**kwargs)

    return make


def _trl_style_factory(spec: str, cls: type, kwargs: dict[str, object]) -> EnvFactory:
    from rlpost.rollout.agent.adapters import TrlStyleEnv

    try:
        inspect.signature(cls).bind(**kwargs)
        TrlStyleEnv(cls(**kwargs))  # its methods' schemas, checked now
    except TypeError as e:
        raise EnvError(
            f"environment {spec!r}: {cls.__name__}({', '.join(kwargs)}) does not match its "
            f"constructor {cls.__name__}{inspect.signature(cls)} ({e}); fix the env kwargs"
        ) from None
    except EnvError as e:
        raise EnvError(f"environment {spec!r}: {e}") from None
    return lambda: TrlStyleEnv(cls(**kwargs))
