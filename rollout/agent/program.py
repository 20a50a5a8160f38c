"""Agent programs: a user's own agent, run unchanged against the chat endpoint.

An agent program is ``fn(client, row)``, ``async def`` (given an
``openai.AsyncOpenAI``) or plain (given an ``openai.OpenAI``, run in a thread),
named by ``agent.program=file.py:fn`` or ``module:fn``. A program whose
``client`` parameter is annotated with Anthropic's client (``anthropic.AsyncAnthropic``
or ``anthropic.Anthropic``) is given that one, speaking the Messages API; one
annotated ``AgentEndpoint`` is given the episode's base URLs and key, for an agent
framework configured by URL and key (or by environment variables, in a process of
its own) rather than by a client object. The client is bound to the episode's
session on the endpoint (``endpoint.py``); whatever the program does with it is
the episode. What it returns:

- a number: the episode's reward;
- ``None``: ``reward.fn`` scores the last assistant message's text;
- a string: ``reward.fn`` scores that string as the final answer;
- a dict with ``"reward"`` (a number) or ``"answer"`` (a string): the same.

A program that raises, returns something else or runs past
``agent.program_timeout_s`` ends its episode with reward 0, counted in
``agent/program_errors`` / ``agent/program_timeouts``: never fatal. The episode
trains on the tokens its calls captured up to then.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from rlpost.rollout.agent.capture import segments
from rlpost.rollout.agent.chat import ChatTokens
from rlpost.rollout.agent.endpoint import ChatEndpoint
from rlpost.rollout.agent.env import prompt_messages
from rlpost.rollout.agent.loop import AgentLoopConfig, Episode, Turn
from rlpost.rollout.agent.sessions import Session
from rlpost.rollout.agent.specs import SPEC_FORMS, load_object
from rlpost.rollout.base import SamplingConfig

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)
# The openai client's HTTP library logs every request at INFO: thousands a step.
for _name in ("httpx", "httpx2"):
    logging.getLogger(_name).setLevel(logging.WARNING)


class ProgramError(ValueError):
    """An agent program cannot be loaded or called; the message says what to change."""


Api = Literal["openai", "anthropic", "endpoint"]


@dataclass(frozen=True)
class Program:
    fn: Callable[..., Any]  # async or plain: a call returns an awaitable or the outcome
    spec: str
    is_async: bool
    api: Api = "openai"  # the client it is given


@dataclass(frozen=True)
class AgentEndpoint:
    """The episode's place on the endpoint, for a program whose ``client`` parameter
    is annotated with this class: what an agent framework is configured with when it
    builds its own client. Each episode has its own key; a request made with it is
    that episode's."""

    base_url: str  # OpenAI's clients: http://host:port/v1
    anthropic_base_url: str  # Anthropic's clients, which add /v1 themselves
    api_key: str
    model: str  # any name is served by the policy; this is the one GET /v1/models lists

    @property
    def env(self) -> dict[str, str]:
        """The variables OpenAI's and Anthropic's SDKs read, for an agent run as a
        process of its own: ``subprocess.run(cmd, env=os.environ | endpoint.env)``."""
        return {
            "OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": self.api_key,
            "ANTHROPIC_BASE_URL": self.anthropic_base_url, "ANTHROPIC_API_KEY": self.api_key,
        }  # fmt: skip


def client_api(fn: Callable[..., object]) -> Api:
    """Which client a program takes, from its first parameter's annotation (a class
    or a string): Anthropic's, the ``AgentEndpoint``, else OpenAI's."""
    params = list(inspect.signature(fn).parameters.values())
    note = params[0].annotation if params else inspect.Parameter.empty
    name = note if isinstance(note, str) else getattr(note, "__qualname__", "")
    if "AgentEndpoint" in name:
        return "endpoint"
    return "anthropic" if "Anthropic" in name else "openai"


def load_program(spec: str, env_kwargs: Mapping[str, object] | None = None) -> Program:
    """The program ``spec`` names, checked now: callable with ``(client, row)``.
    ``verifiers:<taskset>`` is a verifiers environment, configured by ``env_kwargs``
    (``agent.env_kwargs``; ``verifiers_adapter``)."""
    from rlpost.rollout.agent import verifiers_adapter

    if verifiers_adapter.is_verifiers_spec(spec):
        try:
            episode = verifiers_adapter.load_verifiers_program(spec, dict(env_kwargs or {}))
        except verifiers_adapter.VerifiersError as exc:
            raise ProgramError(f"agent program {spec!r}: {exc}") from None
        return Program(episode, spec, True)
    if ":" not in spec:
        raise ProgramError(f"agent program {spec!r} is malformed; use {SPEC_FORMS}")
    fn = load_object(spec, "agent program", ProgramError)
    if not callable(fn) or isinstance(fn, type):
        raise ProgramError(
            f"agent program {spec!r}: is a {type(fn).__name__}, not a function; point the spec "
            "at `async def fn(client, row)` (or a plain def)"
        )
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError:
        raise ProgramError(
            f"agent program {spec!r}: {getattr(fn, '__name__', fn)}{inspect.signature(fn)} cannot "
            "be called as fn(client, row); it takes the episode's OpenAI client and the data row"
        ) from None
    return Program(fn, spec, inspect.iscoroutinefunction(fn), client_api(fn))


def _outcome(value: object) -> tuple[float | None, str | None]:
    """(reward, final answer) from what a program returned; raises ``TypeError``."""
    if value is None:
        return None, None
    if isinstance(value, (int, float)):
        return float(value), None
    if isinstance(value, str):
        return None, value
    if isinstance(value, dict) and ("reward" in value or "answer" in value):
        reward, answer = value.get("reward"), value.get("answer")
        if reward is not None and not isinstance(reward, (int, float)):
            raise TypeError(f"its 'reward' is a {type(reward).__name__}, not a number")
        if answer is not None and not isinstance(answer, str):
            raise TypeError(f"its 'answer' is a {type(answer).__name__}, not a string")
        return (None if reward is None else float(reward)), answer
    raise TypeError(
        f"it returned a {type(value).__name__}; return a number (the reward), None or a string "
        "(reward.fn scores the answer), or {'reward': x} / {'answer': s}"
    )


async def run_program_episodes(
    rows: Sequence[dict],
    n: int,
    *,
    program: Program,
    endpoint: ChatEndpoint,
    tokenizer: PreTrainedTokenizerBase,
    sampling: SamplingConfig,
    config: AgentLoopConfig,
    session_prefix: str,
    timeout_s: float,
    limit: threading.Semaphore | None = None,
    all_segments: bool = True,
) -> list[Episode]:
    """``n`` episodes of ``program`` per row, concurrently (at most as many at once as
    ``limit`` allows across every batch sharing it); row by row, like ``run_episodes``.
    ``all_segments``: a trajectory split by prefix breaks trains every segment
    (``agent.train_segments=all``), else only its last."""
    chat = ChatTokens(tokenizer)
    # Plain programs run in threads of their own: the loop's default executor is
    # small and also resolves the async clients' host names.
    threads = None if program.is_async else ThreadPoolExecutor(max(len(rows) * n, 1))
    # One connection pool for the batch: a client's own costs ~20 ms of CPU to build
    # (its TLS context), seconds a step over a hundred episodes.
    # Loosely typed: an async client for an async program, else a sync one (is_async says).
    http: Any = None  # the program's own framework makes its connections
    if program.api != "endpoint":
        sdk: Any = importlib.import_module(program.api)  # openai or anthropic: their pools
        http = sdk.DefaultAsyncHttpxClient() if program.is_async else sdk.DefaultHttpxClient()

    async def one(i: int, j: int) -> Episode:
        if limit is not None:  # polled: a thread blocked on it would hold an executor's worker
            while not limit.acquire(blocking=False):
                await asyncio.sleep(0.005)
        session = endpoint.sessions.open(f"{session_prefix}-{i}-{j}", i * n + j, sampling, config)
        try:
            status, reward, answer = await _run(
                program, endpoint, session, rows[i], timeout_s, threads, http
            )
        finally:  # also when the batch is cancelled: the key is refused from now on
            endpoint.sessions.close(session.key)
            if limit is not None:
                limit.release()
        return session_episode(
            session, chat, rows[i], i, status, reward, answer, all_segments=all_segments
        )

    try:
        return list(await asyncio.gather(*(one(i, j) for i in range(len(rows)) for j in range(n))))
    finally:
        if threads is not None:
            threads.shutdown(wait=False, cancel_futures=True)
        if http is not None and program.is_async:
            await http.aclose()
        elif http is not None:
            http.close()


async def _run(
    program: Program,
    endpoint: ChatEndpoint,
    session: Session,
    row: dict,
    timeout_s: float,
    threads: ThreadPoolExecutor | None,
    http: Any,  # as run_program_episodes made it for the program
) -> tuple[str, float | None, str | None]:
    client = _client(program, endpoint, session.key, timeout_s, http)
    row = dict(row)  # the program may change its copy
    try:
        if program.is_async:
            value = await asyncio.wait_for(program.fn(client, row), timeout_s)
        else:
            running = asyncio.get_running_loop().run_in_executor(threads, program.fn, client, row)
            value = await asyncio.wait_for(running, timeout_s)
    except asyncio.TimeoutError:
        log.warning("agent program %s: episode %s ran past %ss; it ends with reward 0",
                    program.spec, session.session_id, timeout_s)  # fmt: skip
        return "timeout", 0.0, None
    except Exception as exc:  # a program's failure is its episode's, counted
        log.warning("agent program %s: episode %s raised %s: %s; it ends with reward 0",
                    program.spec, session.session_id, type(exc).__name__, exc)  # fmt: skip
        return "error", 0.0, None
    try:
        reward, answer = _outcome(value)
    except TypeError as exc:
        log.warning("agent program %s: %s; the episode ends with reward 0", program.spec, exc)
        return "error", 0.0, None
    return "ok", reward, answer


def _client(program: Program, endpoint: ChatEndpoint, key: str, timeout_s: float, http: Any) -> Any:
    """The episode's client, as the program takes it (``Program.api``, ``is_async``)."""
    if program.api == "endpoint":
        return AgentEndpoint(endpoint.url, endpoint.root_url, key, endpoint.model_name)
    kwargs = dict(api_key=key, max_retries=0, timeout=timeout_s, http_client=http)
    if program.api == "anthropic":
        import anthropic

        cls = anthropic.AsyncAnthropic if program.is_async else anthropic.Anthropic
        return cls(base_url=endpoint.root_url, **kwargs)
    import openai

    return (openai.AsyncOpenAI if program.is_async else openai.OpenAI)(
        base_url=endpoint.url, **kwargs
    )


def session_episode(
    session: Session,
    chat: ChatTokens,
    row: dict,
    group: int,
    status: str,
    reward: float | None,
    answer: str | None,
    all_segments: bool = True,
) -> Episode:
    """The episode a finished session trains on: its last segment (the one that holds
    the final answer) and, with ``all_segments``, the segments before it, left by
    prefix breaks (``Episode.segments``), as samples of the same episode; without,
    their sampled tokens are counted in ``dropped_tokens``, not trained."""
    parts = segments(session.calls)
    if not parts:  # the program never called the model: nothing it sampled to train
        # A row without a prompt (the program builds its messages) stands as an empty
        # user turn, so the episode still has the template's prompt tokens.
        opening = prompt_messages(row) if "prompt" in row else [{"role": "user", "content": ""}]
        return Episode(
            prompt_ids=chat.prompt_ids(opening), response_ids=[], response_mask=[], logprobs=[],
            messages=opening, reward=0.0 if reward is None else reward,
            final_text=answer or "", num_turns=0, tool_calls=0, tool_errors=0, tool_timeouts=0,
            truncated=False, model_tokens=0, env_tokens=0, session_id=session.session_id,
            group=group, program="no_calls" if status == "ok" else status,
            refused_requests=session.refused,
        )  # fmt: skip
    last = parts[-1]
    final = session.calls[-1]
    messages = [*final.request_messages, final.message]
    turns = [Turn(c.sampled_ids, c.logprobs, c.text, c.finish_reason) for c in last.calls]
    return Episode(
        prompt_ids=last.prompt_ids,
        response_ids=last.response_ids,
        response_mask=last.mask,
        logprobs=last.logprobs,
        messages=messages,
        reward=reward,
        final_text=answer if answer is not None else str(final.message.get("content") or ""),
        num_turns=len(session.calls),
        tool_calls=sum(c.tool_calls for c in session.calls),
        tool_errors=sum(c.tool_errors for c in session.calls),
        tool_timeouts=0,
        truncated=session.truncated or final.finish_reason == "length",
        model_tokens=sum(last.mask),
        env_tokens=len(last.mask) - sum(last.mask),
        session_id=session.session_id,
        group=group,
        turns=turns,
        versions=last.versions,
        program=status,
        prefix_breaks=len(parts) - 1,
        segments=parts[:-1] if all_segments else [],
        dropped_tokens=0 if all_segments else sum(sum(p.mask) for p in parts[:-1]),
        sampling_overridden=session.sampling_overridden,
        refused_requests=session.refused,
    )
