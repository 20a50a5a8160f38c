"""One step's samples: prompts sent to the rollout (single completions or agent
episodes), scored by the reward, shaped (DAPO's overlong penalty) and, with
dynamic sampling, refilled until enough groups disagree."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from rlpost.algos import overlong_penalty, zero_std_groups
from rlpost.config.groups import Config
from rlpost.data.images import row_images
from rlpost.data.rows import PromptStream
from rlpost.data.samples import encode_prompt
from rlpost.loop.streaming import Group, GroupProducer
from rlpost.plan.algo import AlgoSettings
from rlpost.rewards.loading import RewardError
from rlpost.rewards.scoring import RewardScorer
from rlpost.rollout.base import GenerationRequest, GenerationResult, SamplingConfig
from rlpost.serving.rollout_group import RolloutGroup


@dataclasses.dataclass
class Pending:
    """A generation in flight: the step it is for, its prompt rows, the pending results."""

    step: int
    rows: list[dict]
    ref: Any  # a PendingGeneration or, in agent mode, PendingEpisodes
    start: float
    stream_before: dict | None = None  # the prompt stream's state before ``rows`` were drawn


class Finished:
    """Results already in hand (a one_step_off batch restored from a checkpoint)."""

    def __init__(self, results: list[GenerationResult]):
        self.results = results

    def result(self) -> list[GenerationResult]:
        return self.results


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
        stream: PromptStream,
        rollout: RolloutGroup,
        tokenizer: Any,
        scorer: RewardScorer,
        agent: Any = None,
    ):
        self.cfg, self.algo, self.stream = cfg, algo, stream
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

    def launch(self, step: int, results: list[GenerationResult] | None = None) -> Pending:
        """Start generating one step's prompts; returns at once. ``results``: what a
        checkpoint kept of this step's generation (the same rows are drawn again)."""
        before = self.stream.state_dict()
        rows = self.stream.next_batch()
        ref = (
            Finished(results)
            if results is not None
            else self.request(rows, self.sampling, step * 1000)
        )
        return Pending(step, rows, ref, time.perf_counter(), before)

    def request(self, rows: list[dict], sampling: SamplingConfig, seed: int | None) -> Any:
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

    def wait_score_and_fill(self, pending: Pending) -> tuple[Rollouts, dict[str, float]]:
        """Wait for ``pending`` and score it (overlong shaping included); with dynamic
        sampling (DAPO) drop the groups whose rewards all agree and generate more, up
        to ``max_rounds`` rounds; then trim to a group count the ranks can split."""
        ds = self.cfg.algo.dynamic_sampling
        n, want = self.sampling.n, self.cfg.data.prompts_per_step
        kept: list[tuple[dict, GenerationResult, dict[str, torch.Tensor]]] = []
        metrics: dict[str, float] = {}
        gen_s, rounds, dropped = 0.0, 0, 0
        round_pending: Pending | None = pending
        while round_pending is not None:
            rounds += 1
            results = round_pending.ref.result()
            gen_s += time.perf_counter() - round_pending.start
            scores, round_metrics = self.score(results, round_pending.rows, n)
            if self.cfg.algo.overlong.enabled:
                round_metrics.update(self.shape_overlong(results, scores))
            if rounds == 1:
                metrics.update(round_metrics)
            keep_g = torch.ones(len(round_pending.rows), dtype=torch.bool)
            if ds.enabled:
                groups_b = torch.arange(len(round_pending.rows)).repeat_interleave(n)
                keep_g = zero_std_groups(scores["total"], groups_b)[::n]
                dropped += int((~keep_g).sum())
            for g in torch.nonzero(keep_g).flatten().tolist():
                group_scores = {k: v[g * n : (g + 1) * n] for k, v in scores.items()}
                kept.append((round_pending.rows[g], results[g], group_scores))
            round_pending = None
            if ds.enabled and len(kept) < want and rounds < ds.max_rounds:
                more = self.stream.next_batch()
                seed = pending.step * 1000 + rounds
                round_pending = Pending(
                    pending.step, more, self.request(more, self.sampling, seed), time.perf_counter()
                )
        keep = self.trainable_groups(len(kept))
        merged = (
            {k: torch.cat([s[k] for _, _, s in kept[:keep]]) for k in kept[0][2]} if keep else {}
        )
        metrics["timing/generate_s"] = gen_s
        if ds.enabled:
            metrics["dapo/dropped_groups"] = float(dropped)
            metrics["dapo/gen_rounds"] = float(rounds)
            metrics["dapo/kept_groups"] = float(keep)
        rows = [row for row, _, _ in kept[:keep]]
        return Rollouts(rows, [res for _, res, _ in kept[:keep]], merged), metrics

    # -- fully_async: groups one at a time, as they finish ----------------------
    def submit_group(self, row: dict, batch: int) -> Any:
        """Start one prompt group of stream batch ``batch``, seeded as ``sync`` seeds
        that batch's step."""
        return self.request([row], self.sampling, batch * 1000)

    def take(
        self, producer: GroupProducer, version: int
    ) -> tuple[Rollouts, dict[str, float], list[Group]]:
        """The next step's groups for the trainer at policy ``version``: the first
        ``data.prompts_per_step`` to finish within ``async.max_staleness`` (older
        ones dropped and counted), scored; with dynamic sampling, groups whose
        rewards all agree are dropped too and more are taken, up to
        ``max_rounds`` x a batch of groups looked at. In admission order."""
        ds = self.cfg.algo.dynamic_sampling
        n, want = self.sampling.n, self.cfg.data.prompts_per_step
        bound = producer.max_staleness
        kept: list[Group] = []
        kept_scores: list[dict[str, torch.Tensor]] = []
        parts: list[tuple[int, dict[str, float]]] = []  # (samples, score metrics) per call
        stale = looked = zero_std = 0
        while len(kept) < want and not (ds.enabled and kept and looked >= ds.max_rounds * want):
            finished = producer.wait(version)
            fresh: list[Group] = []
            for i, g in enumerate(finished):
                if len(kept) + len(fresh) == want:
                    producer.requeue(finished[i:])
                    break
                g.results = g.handle.result()
                if producer.staleness(g, version, sampled_versions(g.results)) > bound:
                    producer.discard(g)
                    stale += 1
                    continue
                fresh.append(g)
            if not fresh or not ds.enabled:
                kept += fresh
                continue
            scores, metrics = self._score_groups(fresh)
            parts.append((len(fresh) * n, metrics))
            groups_b = torch.arange(len(fresh)).repeat_interleave(n)
            keep_g = zero_std_groups(scores["total"], groups_b)[::n]
            for j, g in enumerate(fresh):
                looked += 1
                group = {k: v[j * n : (j + 1) * n] for k, v in scores.items()}
                if not bool(keep_g[j]):
                    producer.discard(g)
                    zero_std += 1
                    continue
                kept.append(g)
                kept_scores.append(group)
        order = sorted(range(len(kept)), key=lambda i: kept[i].index)
        order = order[: self.trainable_groups(len(kept))]
        for i in sorted(set(range(len(kept))) - set(order)):
            producer.discard(kept[i])  # more than the ranks can split evenly
        if ds.enabled:
            chosen = [kept_scores[i] for i in order]
            merged = {k: torch.cat([s[k] for s in chosen]) for k in chosen[0]} if chosen else {}
            metrics = _combine(parts)
        kept = [kept[i] for i in order]
        results = [g.results[0] for g in kept]
        rows = [g.row for g in kept]
        if not ds.enabled:
            merged, metrics = self._score_groups(kept) if kept else ({}, {})
        metrics["async/dropped_stale"] = float(stale)
        if ds.enabled:
            metrics["dapo/dropped_groups"] = float(zero_std)
            metrics["dapo/kept_groups"] = float(len(kept))
        metrics["timing/generate_s"] = max((g.end - g.start for g in kept), default=0.0)
        return Rollouts(rows, results, merged), metrics, kept

    def _score_groups(
        self, groups: list[Group]
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
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


# Score metrics that count (summed over scoring calls); the rest are means.
_COUNTS = ("errors", "timeouts", "tool_calls", "tool_errors", "turns_cut", "env_rewarded")


def _combine(parts: list[tuple[int, dict[str, float]]]) -> dict[str, float]:
    """The score metrics of several scoring calls as one: counts summed, means
    weighted by each call's samples."""
    total = sum(n for n, _ in parts) or 1
    out: dict[str, float] = {}
    for n, metrics in parts:
        for k, v in metrics.items():
            w = 1.0 if k.rsplit("/", 1)[-1] in _COUNTS else n / total
            out[k] = out.get(k, 0.0) + w * v
    return out


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
