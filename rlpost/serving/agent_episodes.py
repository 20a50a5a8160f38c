"""Agent mode: each sample is a multi-turn episode run through the rollout group.

The controller calls ``AgentRollout.launch`` where it would send single
requests; episodes come back as ``GenerationResult``s whose completions carry
the episode's mask (environment tokens 0), so batching, dynamic sampling and
the trainer see them like any other sample. Every turn of an episode is one
request with the episode's session id, so consistent hashing keeps it on the
replica whose prefix cache holds its earlier turns; the turns of all episodes
of a step are in flight together and replicas batch them.

The episodes of one call run on an asyncio loop in a thread of their own, so
``launch`` returns at once (one-step-off generation overlaps training).

A model turn may use ``agent.max_turn_tokens`` tokens, by default whatever the
episode's ``agent.max_response_tokens`` leaves (as a whole response is limited in
verl's and TRL's multi-turn rollouts); ``rollout.max_tokens``, the limit of a
single-turn completion, does not apply to a turn.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Protocol

import torch

from rlpost.config.groups import Config
from rlpost.result import RunError
from rlpost.rewards.scoring import Scorer
from rlpost.rollout.agent import AgentLoopConfig, Episode, episode_metrics, load_env, run_episodes
from rlpost.rollout.agent.capture import Segment
from rlpost.rollout.agent.endpoint import ChatEndpoint
from rlpost.rollout.agent.env import Env, EnvFactory, ToolEnv, prompt_messages
from rlpost.rollout.agent.program import Program, load_program, run_program_episodes
from rlpost.rollout.agent.tools import load_tools
from rlpost.rollout.base import Completion, GenerationRequest, GenerationResult, SamplingConfig

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)
# One call's episodes, run on the pending call's own event loop.
EpisodesFn = Callable[[], Coroutine[object, object, list[Episode]]]


class TurnGenerator(Protocol):
    """What the episodes ask of a rollout group (a ``RolloutGroup``): one model turn,
    awaited."""

    async def agenerate(self, request: GenerationRequest) -> GenerationResult: ...


def env_factory(cfg: Config) -> EnvFactory:
    """Fresh environments, one per episode: ``agent.env`` or the tool runner over
    ``agent.tools``. Raises ``ToolError`` / ``EnvError`` for a spec that does not load."""
    a = cfg.agent
    if a.env is not None:
        return load_env(a.env, a.env_kwargs)
    tools = load_tools(a.tools)  # loaded once; each episode's ToolEnv shares them
    latency = (a.tool_latency_s[0], a.tool_latency_s[1]) if a.tool_latency_s else None
    seeds = itertools.count(cfg.trainer.seed * 1_000_003)
    return lambda: ToolEnv(
        tools, timeout_s=a.tool_timeout_s, latency_s=latency, seed=next(seeds),
        mcp_sessions=a.mcp_sessions,
    )  # fmt: skip


class PendingEpisodes:
    """Episodes running in a thread; ``result()`` waits for them (and re-raises)."""

    def __init__(self, coro_fn: EpisodesFn, n: int):
        self.n = n
        self._episodes: list[Episode] | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[list[Episode]] | None = None
        self._cancelled = False
        self._thread = threading.Thread(target=self._run, args=(coro_fn,), daemon=True)
        self._thread.start()

    def _run(self, coro_fn: EpisodesFn) -> None:
        loop = asyncio.new_event_loop()
        try:
            with self._lock:
                if self._cancelled:
                    raise asyncio.CancelledError
                self._loop, self._task = loop, loop.create_task(coro_fn())
            self._episodes = loop.run_until_complete(self._task)
        except BaseException as exc:  # handed to the caller of result()
            self._error = exc
        finally:
            with self._lock:
                self._loop = None
            _end_pending(loop)
            loop.close()

    def cancel(self) -> None:
        """Stop the episodes (a run's end): their turns in flight are abandoned."""
        with self._lock:
            self._cancelled = True
            if self._loop is not None and self._task is not None:
                self._loop.call_soon_threadsafe(self._task.cancel)

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> list[GenerationResult]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._episodes is not None
        return episode_results(self._episodes, self.n)


def _end_pending(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel the tasks the episodes left on ``loop`` (the MCP sessions that
    ``agent.mcp_sessions=run`` holds for the batch) and let them end, as
    ``asyncio.run`` does: a session's server process stops with its loop."""
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())


class AgentRollout:
    """Runs ``agent``-mode episodes on a rollout group (anything with an async
    ``agenerate(GenerationRequest)``).

    ``example``, a training row, opens the episode rendered at start-up to check
    that the chat template shows the model its tools (``warn_if_tools_unseen``).
    """

    def __init__(
        self,
        cfg: Config,
        group: TurnGenerator,
        tokenizer: PreTrainedTokenizerBase,
        example: dict | None = None,
    ):
        a = cfg.agent
        self.cfg, self.group, self.tokenizer = cfg, group, tokenizer
        self.make_env = env_factory(cfg)
        self.loop_cfg = AgentLoopConfig(
            max_turns=a.max_turns,
            max_response_tokens=a.max_response_tokens,
            max_model_len=cfg.rollout.max_model_len,
            parser=a.parser,
        )
        self.turn_tokens = a.max_turn_tokens or a.max_response_tokens
        self._calls = 0
        self.program: Program | None = None
        self.endpoint: ChatEndpoint | None = None
        self.limit: threading.BoundedSemaphore | None = None
        if a.program is not None:
            self.program = load_program(a.program, a.env_kwargs)
            self.endpoint = ChatEndpoint(
                self._generate, tokenizer, parser=a.parser, host=a.endpoint_host,
                port=a.endpoint_port,
            ).start()  # fmt: skip
            if a.max_concurrent_episodes:
                self.limit = threading.BoundedSemaphore(a.max_concurrent_episodes)
            log.info("agent.program=%s runs the episodes against %s", a.program, self.endpoint.url)
            if a.tools:
                log.info(
                    "agent.tools=%s: rlpost does not call them (the program calls its own); "
                    "they only check that the chat template shows the model its tools", list(a.tools),
                )  # fmt: skip
        warn_if_tools_unseen(cfg, tokenizer, self.make_env(), example)

    async def _generate(
        self, prompt_ids: list[int], s: SamplingConfig, session_id: str
    ) -> Completion:
        result = await self.group.agenerate(GenerationRequest(prompt_ids, s, session_id))
        return result.completions[0]

    def close(self) -> None:
        if self.endpoint is not None:
            self.endpoint.close()

    def launch(self, rows: list[dict], sampling: SamplingConfig) -> PendingEpisodes:
        """Start ``sampling.n`` episodes per row; returns at once. A turn's token
        limit is ``agent.max_turn_tokens``, whatever ``sampling.max_tokens`` says."""
        self._calls += 1
        prefix = f"s{self._calls}"
        n = sampling.n
        sampling = dataclasses.replace(sampling, max_tokens=self.turn_tokens)

        def episodes() -> Coroutine[object, object, list[Episode]]:
            if self.program is not None:
                assert self.endpoint is not None
                return run_program_episodes(
                    rows, n, program=self.program, endpoint=self.endpoint,
                    tokenizer=self.tokenizer, sampling=sampling, config=self.loop_cfg,
                    session_prefix=prefix, timeout_s=self.cfg.agent.program_timeout_s,
                    limit=self.limit, all_segments=self.cfg.agent.train_segments == "all",
                )  # fmt: skip
            return run_episodes(
                rows, n, generate=self._generate, tokenizer=self.tokenizer,
                make_env=self.make_env, sampling=sampling, config=self.loop_cfg,
                session_prefix=prefix,
            )  # fmt: skip

        return PendingEpisodes(episodes, n)


def tools_unseen_warning(
    tokenizer: PreTrainedTokenizerBase,
    tools: list[dict],
    messages: list[dict],
    *,
    model: str,
    taught: str | None,
) -> str | None:
    """What to tell the user when the chat template ignores ``tools=``: ``messages``
    render the same with and without the tool schemas ``tools``, so the model is never
    shown them. None when the template renders them.

    The text says whether the prompt text itself names the tools (then the model
    may still learn of them) and ``taught``, what else taught the model the call
    format, when something did (the built-in model's warm-up).
    """

    def render(schemas: list[dict | Callable] | None) -> str:
        return str(
            tokenizer.apply_chat_template(
                messages, tools=schemas, tokenize=False, add_generation_prompt=True
            )
        )

    plain = render(None)
    if render(list(tools)) != plain:
        return None
    names = [str(t.get("function", t).get("name")) for t in tools]
    named = [x for x in names if x in plain]
    listed = ", ".join(names)
    if named == names:
        prompt = f"the prompt text itself names {listed}"
    elif named:
        unnamed = ", ".join(x for x in names if x not in named)
        prompt = f"the prompt text names {', '.join(named)} but not {unnamed}"
    else:
        prompt = f"nor does the prompt text name {'it' if len(names) == 1 else 'them'}"
    taught = taught or "nothing else shows the model the tools or how to call them"
    return (
        f"agent mode: the chat template of {model} ignores tools= (a prompt renders the same "
        f"with and without the tool schemas), so the model is never shown {listed}; {prompt}; "
        f"{taught}. To show a model its tools, use a chat template that renders tools= "
        "(Qwen2.5's and Qwen3's do; it is chat_template in tokenizer_config.json), or warm the "
        "model up on solved episodes that call them in the agent.parser format (algo=sft on "
        "rows with 'messages'), or name the tools and the call format in the prompt"
    )


def warn_if_tools_unseen(
    cfg: Config, tokenizer: PreTrainedTokenizerBase, env: Env, example: dict | None
) -> None:
    """Log ``tools_unseen_warning`` for the run's tools (an environment's
    ``tool_schemas``) on the episode that ``example`` opens, once at start-up."""
    tools = getattr(env, "tool_schemas", None)
    if not tools:
        return
    row = example if example is not None else {"prompt": "Hello"}
    # A user's environment may do work in reset(); a row's prompt is what it gets.
    messages = env.reset(row) if isinstance(env, ToolEnv) else prompt_messages(row)
    model = (
        f"model.path={cfg.model.path}"
        if cfg.model.path
        else f"the built-in {cfg.model.preset!r} model"
    )
    warning = tools_unseen_warning(
        tokenizer, tools, list(messages), model=model, taught=_warmup_teaches(cfg)
    )
    if warning:
        log.warning(warning)


def _warmup_teaches(cfg: Config) -> str | None:
    """What the built-in model's warm-up taught it about calling tools."""
    if cfg.model.path is not None:
        return None
    from rlpost.data.tasks.calc import TOOL
    from rlpost.models.warmup import warmup_task

    task = warmup_task(cfg)
    if task == "calc":
        return (
            f"its warm-up imitated solved {task} episodes, which call {TOOL}: that is how it "
            f"knows the call format (nothing to change for agent=calculator)"
        )
    return f"its warm-up on the {task} task had no tool calls: it has never seen the call format"


def episode_results(episodes: list[Episode], n: int) -> list[GenerationResult]:
    """Episodes (row by row, ``n`` each) as one ``GenerationResult`` per row."""
    results = []
    for i in range(0, len(episodes), n):
        group = episodes[i : i + n]
        completions = [
            Completion(
                token_ids=e.response_ids,
                logprobs=e.logprobs,
                text=e.final_text,
                finish_reason="length" if e.truncated else "stop",
                mask=e.response_mask,
                prompt_ids=e.prompt_ids,
                episode=e,
                versions=e.versions or None,
                segments=[segment_completion(s) for s in e.segments] or None,
            )
            for e in group
        ]
        results.append(GenerationResult(prompt_ids=group[0].prompt_ids, completions=completions))
    return results


def segment_completion(segment: Segment) -> Completion:
    """A segment an agent program's prefix break left before its episode's last, as a
    sample of its own (``Completion.segments``)."""
    return Completion(
        token_ids=segment.response_ids,
        logprobs=segment.logprobs,
        text=segment.calls[-1].text if segment.calls else "",
        finish_reason=segment.calls[-1].finish_reason if segment.calls else "stop",
        mask=segment.mask,
        prompt_ids=segment.prompt_ids,
        versions=segment.versions,
    )


def score_episodes(
    scorer: Scorer,
    results: list[GenerationResult],
    rows: list[dict],
    *,
    named_only: bool = False,
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The reward of each episode: its environment's last reward when it gave one,
    else ``reward.fn`` on the final answer and the row (and the messages, when the
    function names that parameter). ``rows`` has one entry per episode.

    ``named_only``: the advantage estimator needs every episode's named rewards
    (gdpo), which an environment's single number does not give; an environment
    reward is then an error rather than a score dropped in favour of zeros.
    """
    episodes: list[Episode] = []
    for r in results:
        for c in r.completions:
            assert c.episode is not None, "an agent rollout's completion holds its episode"
            episodes.append(c.episode)
    own = [i for i, e in enumerate(episodes) if e.reward is None]
    if named_only and len(own) < len(episodes):
        raise RunError(
            f"agent.env: the environment returned a reward for {len(episodes) - len(own)} of "
            f"{len(episodes)} episodes, but algo.advantage.estimator=gdpo normalises each named "
            f"reward of reward.fn ({', '.join(scorer.weights) or 'none given'}) on its own and "
            "an environment's reward is one number; have the environment's step() return "
            "reward None and score episodes with reward.fn, or use another algo (e.g. algo=grpo)"
        )
    named: dict[str, list[float]] = {"total": [float(e.reward or 0.0) for e in episodes]}
    metrics: dict[str, float] = {"reward/errors": 0.0, "reward/timeouts": 0.0}
    if own:
        scores, metrics = scorer.score(
            [episodes[i].final_text for i in own],
            [rows[i] for i in own],
            [{"messages": episodes[i].messages} for i in own],
        )
        for name, values in scores.items():
            column = named.setdefault(name, [0.0] * len(episodes))
            for i, v in zip(own, values):
                column[i] = v
    total = named["total"]
    metrics["reward/mean"] = sum(total) / max(len(total), 1)
    metrics["agent/env_rewarded"] = float(len(episodes) - len(own))
    metrics.update(episode_metrics(episodes))
    return {k: torch.tensor(v, dtype=torch.float32) for k, v in named.items()}, metrics
