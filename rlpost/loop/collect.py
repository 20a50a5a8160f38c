"""Prompts to the rollout and samples to the reward: requests of single
completions or agent episodes, and their scores, shaped by DAPO's overlong
penalty. Which prompts go when, and which groups a step trains, is the
``RolloutSource``'s (``rlpost.loop.source``)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from rlpost.algos import overlong_penalty
from rlpost.config.groups import Config
from rlpost.data.images import row_images
from rlpost.data.samples import encode_prompt
from rlpost.loop.streaming import Group
from rlpost.plan.algo import AlgoSettings
from rlpost.rewards.loading import RewardError
from rlpost.rewards.scoring import Scorer
from rlpost.rollout.base import GenerationRequest, GenerationResult, SamplingConfig
from rlpost.serving.rollout_group import RolloutGroup

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from rlpost.serving.agent_episodes import AgentRollout, PendingEpisodes
    from rlpost.serving.pending import PendingGeneration


@dataclasses.dataclass
class Rollouts:
    """What one step generated: prompt rows, results (one per prompt) and scores."""

    rows: list[dict]
    results: list[GenerationResult]
    scores: dict[str, torch.Tensor]


class Collector:
    """Sends prompts to the rollout group (or the agent's episodes) and scores what
    comes back."""

    def __init__(
        self,
        cfg: Config,
        algo: AlgoSettings,
        rollout: RolloutGroup,
        tokenizer: PreTrainedTokenizerBase,
        scorer: Scorer,
        agent: AgentRollout | None = None,
    ):
        self.cfg, self.algo = cfg, algo
        self.rollout, self.tokenizer, self.scorer = rollout, tokenizer, scorer
        self.agent = agent  # an AgentRollout: samples are multi-turn episodes (agent.*)
        self.sampling = algo.sampling

    @property
    def response_budget(self) -> int:
        """The most response tokens a sample can have: one completion's, or a whole
        episode's in agent mode (DAPO's overlong limit, Dr.GRPO's loss constant)."""
        if self.agent is not None:
            return self.cfg.agent.max_response_tokens
        return self.sampling.max_tokens

    def request(
        self, rows: list[dict], sampling: SamplingConfig, seed: int | None
    ) -> PendingGeneration | PendingEpisodes:
        """Send ``rows`` to the rollout; returns a reference to the results."""
        if seed is not None:
            sampling = dataclasses.replace(sampling, seed=self.cfg.trainer.seed * 100_003 + seed)
        if self.agent is not None:
            return self.agent.launch(rows, sampling)
        requests = [
            GenerationRequest(
                prompt_ids=encode_prompt(self.tokenizer, row),
                sampling=row_sampling(sampling, row),
                images=row_images(row),
            )
            for row in rows
        ]
        return self.rollout.generate_async(requests)

    def score(
        self, results: list[GenerationResult], rows: list[dict], repeat: int
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        flat_rows = [row for row in rows for _ in range(repeat)]
        if self.agent is not None:
            from rlpost.serving.agent_episodes import score_episodes

            named_only = self.algo.advantage.estimator == "gdpo"
            return score_episodes(self.scorer, results, flat_rows, named_only=named_only)
        texts = [c.text for res in results for c in res.completions]
        named, metrics = self.scorer.score(texts, flat_rows)
        scores = {k: torch.tensor(v, dtype=torch.float32) for k, v in named.items()}
        if self.algo.advantage.estimator == "gdpo" and len(scores) == 1:
            raise RewardError(
                f"algo=gdpo normalises each named reward on its own, but reward.fn="
                f"{self.cfg.reward.fn} returns a single number; return a dict of named "
                "floats (e.g. {'correctness': ..., 'format': ...}) or use algo=grpo"
            )
        return scores, metrics

    def shape_overlong(
        self, results: list[GenerationResult], scores: dict[str, torch.Tensor]
    ) -> dict[str, float]:
        """DAPO's overlong reward shaping, added to the total score in place."""
        ol = self.cfg.algo.overlong
        lengths = torch.tensor([len(c.token_ids) for res in results for c in res.completions])
        # An episode's length limit is its whole response budget, not one turn's.
        penalty = ol.factor * overlong_penalty(
            lengths, max_len=self.response_budget, buffer=ol.buffer
        )
        scores["total"] = scores["total"] + penalty
        return {"reward/overlong_penalty_mean": float(penalty.mean())}

    def submit_group(self, row: dict, batch: int) -> PendingGeneration | PendingEpisodes:
        """Start one prompt group of stream batch ``batch``, seeded as a whole batch
        for step ``batch`` is (``rlpost.loop.source``)."""
        return self.request([row], self.sampling, batch * 1000)

    def score_groups(self, groups: list[Group]) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """Score prompt groups' samples in one call (overlong shaping included)."""
        results = [g.results[0] for g in groups]
        scores, metrics = self.score(results, [g.row for g in groups], self.sampling.n)
        if self.cfg.algo.overlong.enabled:
            metrics.update(self.shape_overlong(results, scores))
        return scores, metrics

    def trainable_groups(self, available: int) -> int:
        """The most of ``available`` groups, up to ``data.prompts_per_step``, whose
        samples split evenly over the ranks and mini-batches."""
        keep = min(available, self.cfg.data.prompts_per_step)
        while keep and (keep * self.sampling.n) % self.algo.group_multiple:
            keep -= 1
        return keep


def row_sampling(sampling: SamplingConfig, row: dict) -> SamplingConfig:
    """A row's own ``max_tokens`` / ``min_tokens`` columns, where it has them: a
    shorter limit than ``rollout.max_tokens`` (never a longer one) and a
    ``min_tokens`` capped at the limit."""
    longest, shortest = row.get("max_tokens"), row.get("min_tokens")
    if longest is None and shortest is None:
        return sampling
    limit = sampling.max_tokens if longest is None else max(1, min(longest, sampling.max_tokens))
    floor = sampling.min_tokens if shortest is None else shortest
    return dataclasses.replace(sampling, max_tokens=limit, min_tokens=min(floor, limit))


def sampled_versions(results: list[GenerationResult]) -> list[int]:
    """The policy version of every sampled token (an episode's environment tokens
    left out; -1 where an engine did not say)."""
    out: list[int] = []
    for res in results:
        for c in res.completions:
            versions = c.versions if c.versions is not None else [-1] * len(c.token_ids)
            mask = c.mask if c.mask is not None else [1] * len(versions)
            out += [v for v, m in zip(versions, mask) if m]
    return out
