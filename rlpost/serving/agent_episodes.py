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
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import torch

from rlpost.config.groups import Config
from rlpost.loop.result import RunError
from rlpost.rewards.scoring import RewardScorer
from rlpost.rollout.agent import AgentLoopConfig, Episode, episode_metrics, load_env, run_episodes
from rlpost.rollout.agent.env import EnvFactory, ToolEnv
from rlpost.rollout.agent.tools import load_tools
from rlpost.rollout.base import Completion, GenerationRequest, GenerationResult, SamplingConfig


def env_factory(cfg: Config) -> EnvFactory:
    """Fresh environments, one per episode: ``agent.env`` or the tool runner over
    ``agent.tools``. Raises ``ToolError`` / ``EnvError`` for a spec that does not load."""
    a = cfg.agent
    if a.env is not None:
        return load_env(a.env, a.env_kwargs)
    tools = load_tools(a.tools)  # loaded once; each episode's ToolEnv shares them
    return lambda: ToolEnv(tools, timeout_s=a.tool_timeout_s)


class PendingEpisodes:
    """Episodes running in a thread; ``result()`` waits for them (and re-raises)."""

    def __init__(self, coro_fn: Callable[[], Any], n: int):
        self.n = n
        self._episodes: list[Episode] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(coro_fn,), daemon=True)
        self._thread.start()

    def _run(self, coro_fn: Callable[[], Any]) -> None:
        try:
            self._episodes = asyncio.run(coro_fn())
        except BaseException as exc:  # handed to the caller of result()
            self._error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> list[GenerationResult]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._episodes is not None
        return episode_results(self._episodes, self.n)


class AgentRollout:
    """Runs ``agent``-mode episodes on a rollout group (anything with an async
    ``agenerate(GenerationRequest)``)."""

    def __init__(self, cfg: Config, group: Any, tokenizer: Any):
        a = cfg.agent
        self.group, self.tokenizer = group, tokenizer
        self.make_env = env_factory(cfg)
        self.loop_cfg = AgentLoopConfig(
            max_turns=a.max_turns,
            max_response_tokens=a.max_response_tokens,
            max_model_len=cfg.rollout.max_model_len,
            parser=a.parser,
        )
        self._calls = 0

    def launch(self, rows: list[dict], sampling: SamplingConfig) -> PendingEpisodes:
        """Start ``sampling.n`` episodes per row; returns at once."""
        self._calls += 1
        prefix = f"s{self._calls}"
        n = sampling.n

        async def generate(prompt_ids: list[int], s: SamplingConfig, session_id: str):
            result = await self.group.agenerate(GenerationRequest(prompt_ids, s, session_id))
            return result.completions[0]

        def episodes() -> Any:
            return run_episodes(
                rows, n, generate=generate, tokenizer=self.tokenizer, make_env=self.make_env,
                sampling=sampling, config=self.loop_cfg, session_prefix=prefix,
            )  # fmt: skip

        return PendingEpisodes(episodes, n)


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
            )
            for e in group
        ]
        results.append(GenerationResult(prompt_ids=group[0].prompt_ids, completions=completions))
    return results


def score_episodes(
    scorer: RewardScorer,
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
    episodes: list[Episode] = [c.episode for r in results for c in r.completions]
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
