"""The multi-turn episode loop: model turns and environment turns, token in, token out.

Shapes: an episode is flat lists over its response tokens (t); nothing here pads.

The trajectory is exactly what the engine sampled plus the environment's messages
tokenised as the chat template renders them after those ids (see ``chat.py``);
decoded text is never tokenised again, so the trainer scores the very tokens the
policy produced and ``logprobs`` stay comparable with its own.

Each turn's prompt is the previous prompt + the sampled ids + the environment's
delta ids; the chat is never rendered afresh, which would change earlier turns
under templates such as Qwen3's (see ``chat.py``). An episode ends when the
environment says done (``ToolEnv``: the model answered without a tool call),
after ``max_turns`` model turns, or when its response budget is spent. The
budget ``max_response_tokens`` counts every token after the prompt, model and
environment tokens alike, because that is the length the trainer has to fit;
``max_model_len`` bounds prompt + response. Each model turn is also limited to
``sampling.max_tokens``; a turn that hits its limit (finish reason ``"length"``)
is *cut* and counted in ``Episode.turns_cut``. An episode that stops for lack of
turns or room, or that ends on a cut turn (the environment said done to a reply
the model did not finish), is ``truncated``. A turn cut by the episode's budget
ends the episode before the environment sees it; messages an environment returns
with ``done`` (or after the last allowed turn) are not added, since no model turn
follows them: ``messages`` is always the chat the tokens hold.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, TypeVar

from rlpost.rollout.agent.capture import Segment
from rlpost.rollout.agent.chat import ChatTokens
from rlpost.rollout.agent.env import Env, EnvFactory
from rlpost.rollout.agent.parsers import ParsedTurn, get_parser
from rlpost.rollout.base import AsyncRolloutEngine, Completion, GenerationRequest, SamplingConfig

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

GenerateFn = Callable[[list[int], SamplingConfig, str], Awaitable[Completion]]
T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentLoopConfig:
    """Limits of one episode; the per-turn token limit is ``SamplingConfig.max_tokens``."""

    max_turns: int  # model turns
    max_response_tokens: int  # model + environment tokens after the prompt
    max_model_len: int  # prompt + response, the engine's context
    parser: str | None = "hermes"  # tool-call parser name or spec; None: plain text

    def __post_init__(self) -> None:
        errors = [
            f"{k}={getattr(self, k)} must be >= 1"
            for k in ("max_turns", "max_response_tokens", "max_model_len")
            if getattr(self, k) < 1
        ]
        if errors:
            raise ValueError("invalid AgentLoopConfig: " + "; ".join(errors))


@dataclass
class Turn:
    """One model turn and the environment tokens that followed it."""

    sampled_ids: list[int]
    logprobs: list[float]
    text: str  # the sampled ids decoded, without the end token
    finish_reason: str  # "length": cut at the turn's token limit
    env_ids: list[int] = field(default_factory=list)


@dataclass
class Episode:
    prompt_ids: list[int]
    response_ids: list[int]  # model and environment tokens after the prompt
    response_mask: list[int]  # 1 on model-sampled tokens, 0 on environment tokens
    logprobs: list[float]  # the engine's on model tokens, 0.0 on environment tokens
    messages: list[dict]  # the whole chat the tokens render
    reward: float | None  # the environment's last reward that was not None
    final_text: str  # the last assistant message's content
    num_turns: int
    tool_calls: int
    tool_errors: int  # malformed calls and calls that failed
    tool_timeouts: int
    truncated: bool
    model_tokens: int
    env_tokens: int
    session_id: str
    group: int  # the row's index: the n episodes of a row form one group
    turns: list[Turn] = field(default_factory=list)
    # The policy version that sampled each response token (-1: environment tokens,
    # or an engine that did not say).
    versions: list[int] = field(default_factory=list)
    # Agent programs (``program.py``): how the program ended ("ok", "error",
    # "timeout", "no_calls"; None: the native loop), the prefix breaks of its
    # trajectory, the segments before the last one that are trained as samples of
    # this episode (``agent.train_segments=all``) or else the sampled tokens they
    # held (not trained), requests whose temperature / top_p / seed the endpoint
    # ignored, and requests it refused (a parameter it cannot serve).
    program: str | None = None
    prefix_breaks: int = 0
    segments: list[Segment] = field(default_factory=list)
    dropped_tokens: int = 0
    sampling_overridden: int = 0
    refused_requests: int = 0

    @property
    def turns_cut(self) -> int:
        """Model turns cut at their token limit, the episode's last one or not."""
        return sum(t.finish_reason == "length" for t in self.turns)


def engine_generate(engine: AsyncRolloutEngine) -> GenerateFn:
    """The loop's ``generate`` for any engine with ``agenerate`` (hf, vllm, a router's
    replica): one request, one completion, the session id passed along for routing."""

    async def generate(prompt_ids: list[int], sampling: SamplingConfig, session_id: str):
        request = GenerationRequest(prompt_ids, replace(sampling, n=1), session_id)
        return (await engine.agenerate(request)).completions[0]

    return generate


async def run_episodes(
    rows: Sequence[dict],
    n: int,
    *,
    generate: GenerateFn,
    tokenizer: PreTrainedTokenizerBase,
    make_env: EnvFactory,
    sampling: SamplingConfig,
    config: AgentLoopConfig,
    session_prefix: str | None = None,
) -> list[Episode]:
    """Run ``n`` episodes per row, all ``len(rows) * n`` concurrently; returns them row by
    row (episode ``i * n + j`` is sample ``j`` of row ``i``, ``group == i``).

    Every episode has its own session id (``{prefix}-{i}-{j}``) and, when
    ``sampling.seed`` is set, its own seed per turn derived from it, so a run is
    reproducible and the samples of a group differ.
    """
    prefix = session_prefix or uuid.uuid4().hex[:12]
    parse = get_parser(config.parser) if config.parser is not None else None
    templates: dict[str, ChatTokens] = {}

    async def one(i: int, j: int) -> Episode:
        env = make_env()
        try:
            return await _episode(
                rows[i], i, f"{prefix}-{i}-{j}", i * n + j, generate, tokenizer, env,
                sampling, config, parse, templates,
            )  # fmt: skip
        finally:  # also when cancelled: an environment's connection or process goes
            await _close(env)

    return list(await asyncio.gather(*(one(i, j) for i in range(len(rows)) for j in range(n))))


async def _close(env: object) -> None:
    """``env.close()`` when the environment has one (a server session, a process);
    its failure is logged, never the episode's."""
    close = getattr(env, "close", None)
    if not callable(close):
        return
    try:
        await _maybe_await(close())
    except Exception as exc:  # noqa: BLE001 - a failed close costs nothing the run needs
        log.warning("agent.env: %s.close() raised %s: %s", type(env).__name__,
                    type(exc).__name__, exc)  # fmt: skip


async def _episode(
    row: dict,
    group: int,
    session_id: str,
    index: int,
    generate: GenerateFn,
    tokenizer: PreTrainedTokenizerBase,
    env: Env,
    sampling: SamplingConfig,
    config: AgentLoopConfig,
    parse: Callable[[str], ParsedTurn] | None,
    templates: dict[str, ChatTokens],
) -> Episode:
    messages = list(await _maybe_await(env.reset(row)))
    tools = getattr(env, "tool_schemas", None)
    key = repr(tools)  # tokenizer-wide probes, once per distinct tool list
    chat = templates.get(key) or templates.setdefault(key, ChatTokens(tokenizer, tools))
    prompt_ids = chat.prompt_ids(messages)
    ids: list[int] = list(prompt_ids)  # the next turn's prompt
    response: list[int] = []
    mask: list[int] = []
    logps: list[float] = []
    versions: list[int] = []
    turns: list[Turn] = []
    reward: float | None = None
    calls = parse_errors = 0
    truncated = False
    for turn in range(config.max_turns):
        room = min(
            sampling.max_tokens,
            config.max_response_tokens - len(response),
            config.max_model_len - len(ids),
        )
        if room < 1:
            truncated = True
            break
        seed = None if sampling.seed is None else _seed(sampling.seed, index, turn)
        completion = await generate(
            ids, replace(sampling, n=1, max_tokens=room, seed=seed), session_id
        )
        sampled = list(completion.token_ids)
        ids += sampled
        response += sampled
        mask += [1] * len(sampled)
        logps += list(completion.logprobs)
        versions += list(completion.versions or [-1] * len(sampled))
        ended = completion.finish_reason == "stop" and bool(sampled)
        text = chat.decode(sampled[:-1] if ended else sampled)
        turns.append(Turn(sampled, list(completion.logprobs), text, completion.finish_reason))
        parsed = parse(text) if parse is not None else ParsedTurn(content=text)
        calls += len(parsed.tool_calls)
        parse_errors += len(parsed.errors)
        message = assistant_message(parsed)
        messages.append(message)
        if not ended and room < sampling.max_tokens and len(sampled) >= room:
            truncated = True  # cut by the episode's budget, not by the per-turn limit
            break
        new, done, step_reward = await _maybe_await(env.step({**message, "text": text}))
        reward = step_reward if step_reward is not None else reward
        if done:
            truncated = completion.finish_reason == "length"  # its last turn was cut
            break
        if turn == config.max_turns - 1:
            truncated = True
            break
        delta = chat.delta_ids(messages, list(new), chat.decode(sampled[-1:]) if ended else None)
        # the delta must leave room for at least one more model token
        if (
            len(response) + len(delta) >= config.max_response_tokens
            or len(ids) + len(delta) >= config.max_model_len
        ):
            truncated = True
            break
        messages += new
        turns[-1].env_ids = delta
        ids += delta
        response += delta
        mask += [0] * len(delta)
        logps += [0.0] * len(delta)
        versions += [-1] * len(delta)
    outcomes = getattr(env, "outcomes", None) or []
    assistant = [m for m in messages if m.get("role") == "assistant"]
    return Episode(
        prompt_ids=prompt_ids,
        response_ids=response,
        response_mask=mask,
        logprobs=logps,
        messages=messages,
        reward=reward,
        final_text=str(assistant[-1]["content"]) if assistant else "",
        num_turns=len(turns),
        tool_calls=calls,
        tool_errors=parse_errors + sum(o.status == "error" for o in outcomes),
        tool_timeouts=sum(o.status == "timeout" for o in outcomes),
        truncated=truncated,
        model_tokens=sum(mask),
        env_tokens=len(mask) - sum(mask),
        session_id=session_id,
        group=group,
        turns=turns,
        versions=versions,
    )


def assistant_message(parsed: ParsedTurn) -> dict:
    """The chat message of a parsed turn, tool calls in the OpenAI form."""
    message: dict[str, object] = {"role": "assistant", "content": parsed.content}
    if parsed.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in parsed.tool_calls
        ]
    if parsed.errors:
        message["tool_call_errors"] = list(parsed.errors)
    return message


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Batch metrics: means per episode, tool counts and cut turns summed over the
    batch, ``agent/truncated`` the fraction of truncated episodes."""
    count = max(len(episodes), 1)
    out = {
        "agent/turns_mean": sum(e.num_turns for e in episodes) / count,
        "agent/tool_calls": float(sum(e.tool_calls for e in episodes)),
        "agent/tool_errors": float(sum(e.tool_errors for e in episodes)),
        "agent/tool_timeouts": float(sum(e.tool_timeouts for e in episodes)),
        "agent/truncated": sum(e.truncated for e in episodes) / count,
        "agent/turns_cut": float(sum(e.turns_cut for e in episodes)),
        "agent/model_tokens_mean": sum(e.model_tokens for e in episodes) / count,
        "agent/env_tokens_mean": sum(e.env_tokens for e in episodes) / count,
    }
    if any(e.program is not None for e in episodes):  # agent programs' episodes
        for status, key in (("error", "errors"), ("timeout", "timeouts"), ("no_calls", "no_calls")):
            out[f"agent/program_{key}"] = float(sum(e.program == status for e in episodes))
        out["agent/prefix_breaks"] = float(sum(e.prefix_breaks for e in episodes))
        out["agent/dropped_tokens"] = float(sum(e.dropped_tokens for e in episodes))
        out["agent/split_samples"] = float(sum(len(e.segments) for e in episodes))
        out["agent/sampling_overridden"] = float(sum(e.sampling_overridden for e in episodes))
        out["agent/refused_requests"] = float(sum(e.refused_requests for e in episodes))
    return out


def _seed(base: int, episode: int, turn: int) -> int:
    digest = hashlib.blake2b(f"{base}/{episode}/{turn}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


async def _maybe_await(value: T | Awaitable[T]) -> T:
    if inspect.isawaitable(value):
        return await value
    return value
