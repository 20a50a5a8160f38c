"""Multi-turn agent rollouts: tool-call parsers, tools, environments and the episode loop.

Nothing here imports Ray. Names are imported on first use, so a tool worker
process (which imports ``rlpost.rollout.agent.tools``) does not pay for torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "ParsedTurn": "parsers",
    "PARSERS": "parsers",
    "ToolCall": "parsers",
    "get_parser": "parsers",
    "parse_hermes": "parsers",
    "tool_schema": "tool_schema",
    "TOOLS": "tools",
    "Tool": "tools",
    "ToolError": "tools",
    "ToolOutcome": "tools",
    "load_tool": "tools",
    "load_tools": "tools",
    "register_tool": "tools",
    "run_tool_calls": "tools",
    "ToolWorkerPool": "tool_pool",
    "ENVS": "env",
    "Env": "env",
    "EnvError": "env",
    "ToolEnv": "env",
    "load_env": "env",
    "ChatTokens": "chat",
    "AgentEndpoint": "program",
    "AgentLoopConfig": "loop",
    "Episode": "loop",
    "GenerateFn": "loop",
    "Turn": "loop",
    "engine_generate": "loop",
    "episode_metrics": "loop",
    "run_episodes": "loop",
}

if TYPE_CHECKING:
    from rlpost.rollout.agent.chat import ChatTokens
    from rlpost.rollout.agent.env import ENVS, Env, EnvError, ToolEnv, load_env
    from rlpost.rollout.agent.loop import (
        AgentLoopConfig,
        Episode,
        GenerateFn,
        Turn,
        engine_generate,
        episode_metrics,
        run_episodes,
    )
    from rlpost.rollout.agent.parsers import PARSERS, ParsedTurn, ToolCall, get_parser, parse_hermes
    from rlpost.rollout.agent.program import AgentEndpoint
    from rlpost.rollout.agent.tool_pool import ToolWorkerPool
    from rlpost.rollout.agent.tool_schema import tool_schema
    from rlpost.rollout.agent.tools import (
        TOOLS,
        Tool,
        ToolError,
        ToolOutcome,
        load_tool,
        load_tools,
        register_tool,
        run_tool_calls,
    )


def __getattr__(name: str) -> object:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rlpost.rollout.agent' has no attribute {name!r}")
    return getattr(importlib.import_module(f"rlpost.rollout.agent.{_EXPORTS[name]}"), name)


__all__ = [
    "AgentEndpoint",
    "AgentLoopConfig",
    "ChatTokens",
    "ENVS",
    "Env",
    "EnvError",
    "Episode",
    "GenerateFn",
    "PARSERS",
    "ParsedTurn",
    "TOOLS",
    "Tool",
    "ToolCall",
    "ToolEnv",
    "ToolError",
    "ToolOutcome",
    "ToolWorkerPool",
    "Turn",
    "engine_generate",
    "episode_metrics",
    "get_parser",
    "load_env",
    "load_tool",
    "load_tools",
    "parse_hermes",
    "register_tool",
    "run_episodes",
    "run_tool_calls",
    "tool_schema",
]
