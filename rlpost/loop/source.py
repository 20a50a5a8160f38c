"""Where the RL loop's samples come from: one ``RolloutSource`` for every mode.

The source sends prompts to the rollout, scores what comes back and hands the
trainer whole, scored prompt groups (``take``); it hears of every new policy
version (``on_weights``) and decides when the weights reach the replicas.
``trainer.async_mode`` is a setting of it, two numbers:

| mode | staleness | admission |
|---|---|---|
| ``sync`` | 0 | a step's batch is sent when the step takes it |
| ``one_step_off`` | 1 | the next step's batch is sent as soon as this step's is back, before the update |
| ``fully_async`` | ``async.max_staleness`` | group by group as places free (``rlpost.loop.streaming``), ``async.partial_rollout`` |

With whole-batch admission the new weights wait until the batch in flight is
back (the replicas never change weights under it); with group admission they
go out at once, interrupting the requests in flight where
``async.partial_rollout`` says so.

DAPO's dynamic sampling is one loop here (``_fill``): groups whose rewards all
agree are dropped and more are taken -- another batch, or the next groups to
finish -- until a batch is full or ``algo.dynamic_sampling.max_rounds`` x a batch
of groups was looked at.

Resume: a checkpoint keeps the source's ``state_dict``. With whole-batch
admission that is the batch in flight (its results, and the prompt stream's
state before its rows were drawn), so a resumed ``one_step_off`` run trains what
an uninterrupted one trains; agent episodes are generated again from the same
rows. ``fully_async`` keeps only the stream position: the groups generating or
buffered at the checkpoint are skipped, and counted in a warning.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, TypedDict

import torch

from rlpost.algos import zero_std_groups
from rlpost.config.groups import Config
from rlpost.data.rows import PromptStream
from rlpost.loop.collect import Collector, Rollouts, sampled_versions
from rlpost.loop.concurrency import InflightLimit
from rlpost.loop.step_metrics import results_from_json, results_to_json
from rlpost.loop.streaming import Group, GroupProducer
from rlpost.rollout.base import GenerationResult
from rlpost.runtime.spans import span
from rlpost.serving.weight_sync import WeightSync

if TYPE_CHECKING:
    from rlpost.serving.agent_episodes import PendingEpisodes
    from rlpost.serving.pending import PendingGeneration

log = logging.getLogger(__name__)


class InFlight(TypedDict, total=False):
    """What a checkpoint keeps of the generation in flight (``RolloutSource.state_dict``):
    whole batches: the next batch's ``step``, the stream before its rows and, but for
    agent episodes, its ``results`` (``results_to_json``); groups: the stream position
    and how many groups it does not keep."""

    step: int
    stream: dict | None
    results: list[dict]
    unsaved_groups: int


@dataclasses.dataclass
class Batch:
    """A whole batch in flight: the step it is for, its prompt rows, the pending
    results (``Collector.request``) and the stream's state before its rows."""

    step: int
    rows: list[dict]
    ref: PendingGeneration | PendingEpisodes | Finished
    start: float
    stream_before: dict | None = None


class Finished:
    """Results already in hand (a batch a checkpoint kept)."""

    def __init__(self, results: list[GenerationResult]):
        self.results = results

    def result(self) -> list[GenerationResult]:
        return self.results


@dataclasses.dataclass(frozen=True)
class Admission:
    """How far the rollout may run ahead of the trainer: ``staleness`` updates,
    whole batches (``group=False``) or prompt groups one at a time."""

    staleness: int
    group: bool = False
    max_inflight: int = 0  # group admission: groups generating at once
    auto: bool = False  # group admission: the limit steered each step (InflightLimit)
    interrupt: bool = False  # group admission: new weights interrupt requests in flight

    @classmethod
    def of(cls, cfg: Config) -> Admission:
        """``trainer.async_mode`` (and ``async.*``) as a staleness and an admission."""
        mode, a = cfg.trainer.async_mode, cfg.async_
        if mode == "fully_async":
            per_step = cfg.data.prompts_per_step
            auto = a.max_inflight == "auto"
            if auto:
                inflight = InflightLimit(per_step, a.max_staleness).limit
            else:
                inflight = int(a.max_inflight) or 2 * per_step
            return cls(
                a.max_staleness, group=True, max_inflight=inflight, interrupt=a.partial_rollout,
                auto=auto,
            )  # fmt: skip
        return cls(1 if mode == "one_step_off" else 0)


class RolloutSource:
    """Scored prompt groups for steps ``first`` .. ``last``, with the policy
    versions that sampled them. ``weights`` is the run's weight sync."""

    def __init__(
        self,
        cfg: Config,
        collector: Collector,
        stream: PromptStream,
        weights: WeightSync,
        admission: Admission,
        first: int,
        last: int,
    ):
        self.cfg, self.collector, self.stream, self.weights = cfg, collector, stream, weights
        self.admission, self.first, self.last = admission, first, last
        self.per_step = cfg.data.prompts_per_step
        self.ahead: deque[Batch] = deque()  # whole batches sent for later steps
        self.restored: list[GenerationResult] | None = None  # the first batch, as kept
        self.waiting: int | None = None  # a version whose push waits for the batch in flight
        self.dropped_stale = 0  # group admission: groups past the bound, so far
        self.producer: GroupProducer | None = None
        # async.max_inflight=auto: the limit, and what it last saw (rlpost.loop.concurrency)
        self.limit = InflightLimit(self.per_step, admission.staleness) if admission.auto else None
        self._step_start, self._wait_s = time.perf_counter(), 0.0
        self._seen = (0.0, 0)  # preemptions, stale drops at the last steer
        if admission.group:
            self.producer = GroupProducer(
                stream.next_batch, collector.submit_group, self.per_step,
                max_inflight=admission.max_inflight, max_staleness=admission.staleness,
                first_batch=first,
            )  # fmt: skip

    # -- the step's groups ---------------------------------------------------------
    def take(self, step: int, version: int) -> tuple[Rollouts, dict[str, float]]:
        """Step ``step``'s groups for the trainer at policy ``version``, scored."""
        start = self._step_start = time.perf_counter()
        if self.producer is not None:
            self.producer.fill(version)
        kept, metrics = self._fill(step, version)
        if self.producer is None:
            if self.admission.staleness:  # how much of the generation the update hid
                metrics["timing/generate_wait_s"] = time.perf_counter() - start
                gen_s = max(metrics["timing/generate_s"], 1e-9)
                metrics["perf/overlap_frac"] = 1.0 - metrics["timing/generate_wait_s"] / gen_s
            if self.waiting is not None:  # the replicas are idle: the last update first
                metrics.update(self.weights.push(self.waiting))
                self.waiting = None
            for later in range(
                step + 1 + len(self.ahead), min(step + self.admission.staleness, self.last) + 1
            ):
                self.ahead.append(self._send(later))
        else:
            metrics["async/trainer_wait_s"] = self._wait_s = time.perf_counter() - start
            self.producer.fill(version)  # what the take freed, before the update
        return self._rollouts(kept), metrics

    def _fill(self, step: int, version: int) -> tuple[list[Group], dict[str, float]]:
        """The groups of one step: round after round of finished groups, with
        dynamic sampling's filter; trimmed to a count the ranks can split."""
        ds, n, want = self.cfg.algo.dynamic_sampling, self.cfg.rollout.n, self.per_step
        # data.curriculum=gate filters as dynamic sampling does (rlpost.data.curriculum)
        gate = ds.enabled or self.cfg.data.curriculum == "gate"
        kept: list[Group] = []
        parts: list[tuple[int, dict[str, float]]] = []  # (samples, score metrics) per round
        rounds = looked = zero_std = stale = 0
        gen_s = 0.0
        while True:
            if self.producer is None:
                fresh, seconds = self._batch_round(step, version, rounds)
                gen_s += seconds
            else:
                fresh, late = self._group_round(version, want - len(kept))
                stale += late
            rounds += 1
            if gate and fresh:
                total, score_metrics = self._score(fresh)
                parts.append((len(fresh) * n, score_metrics))
                varied = zero_std_groups(total, torch.arange(len(fresh)).repeat_interleave(n))
                for j, g in enumerate(fresh):
                    looked += 1
                    if bool(varied[j * n]):
                        kept.append(g)
                    else:
                        self._discard(g)
                        zero_std += 1
            else:
                kept += fresh
            if len(kept) >= want or (gate and looked >= ds.max_rounds * want):
                break
        kept.sort(key=lambda g: g.index)
        keep = self.collector.trainable_groups(len(kept))
        for g in kept[keep:]:
            self._discard(g)  # more than the ranks can split evenly
        kept = kept[:keep]
        if gate:
            metrics = _combine(parts)
            metrics["dapo/dropped_groups"] = float(zero_std)
            metrics["dapo/gen_rounds"] = float(rounds)
            metrics["dapo/kept_groups"] = float(keep)
        else:
            metrics = self._score(kept)[1] if kept else {}
        if self.producer is None:
            metrics["timing/generate_s"] = gen_s
        else:
            metrics["timing/generate_s"] = max((g.end - g.start for g in kept), default=0.0)
            self.dropped_stale += stale
        return kept, metrics

    def _batch_round(self, step: int, version: int, rounds: int) -> tuple[list[Group], float]:
        """Whole-batch admission: the step's batch (sent ahead, kept by a
        checkpoint, or sent now), or with dynamic sampling another one."""
        if rounds:
            batch = self._send(step, seed=step * 1000 + rounds)
        elif self.ahead:
            batch = self.ahead.popleft()
        else:
            batch = self._send(step, kept=self.restored)
            self.restored = None
        results = batch.ref.result()
        end = time.perf_counter()
        base = rounds * self.per_step
        groups = [
            Group(base + i, step, row, None, version, batch.start, end, [result])
            for i, (row, result) in enumerate(zip(batch.rows, results))
        ]
        return groups, end - batch.start

    def _group_round(self, version: int, need: int) -> tuple[list[Group], int]:
        """Group admission: the groups finished so far (waiting for one), at most
        ``need``, those past ``async.max_staleness`` dropped; returns them and
        how many were dropped."""
        assert self.producer is not None
        finished = self.producer.wait(version)
        fresh: list[Group] = []
        stale = 0
        for i, g in enumerate(finished):
            if len(fresh) == need:
                self.producer.requeue(finished[i:])
                break
            assert g.handle is not None  # an admitted group's
            g.results = g.handle.result()
            if (
                self.producer.staleness(g, version, sampled_versions(g.results))
                > self.admission.staleness
            ):
                self.producer.discard(g)
                stale += 1
                continue
            fresh.append(g)
        return fresh, stale

    def _send(
        self, step: int, seed: int | None = None, kept: list[GenerationResult] | None = None
    ) -> Batch:
        """Draw a batch of rows and send them (seeded by ``step``: ``step * 1000``);
        ``kept``: their results as a checkpoint kept them."""
        before = self.stream.state_dict()
        rows = self.stream.next_batch()
        sampling = self.collector.sampling
        ref = (
            Finished(kept)
            if kept is not None
            else self.collector.request(rows, sampling, seed if seed is not None else step * 1000)
        )
        return Batch(step, rows, ref, time.perf_counter(), before)

    def _score(self, groups: list[Group]) -> tuple[torch.Tensor, dict[str, float]]:
        """Score ``groups`` in one call; each keeps its own scores. Returns the
        total scores of all and the call's metrics."""
        with span("score", cat="reward", groups=len(groups)):
            scores, metrics = self.collector.score_groups(groups)
        n = self.cfg.rollout.n
        for j, g in enumerate(groups):
            g.scores = {k: v[j * n : (j + 1) * n] for k, v in scores.items()}
            self.stream.record(g.row, g.scores["total"].tolist())  # data.curriculum's memory
        return scores["total"], metrics

    def _discard(self, group: Group) -> None:
        if self.producer is not None:
            self.producer.discard(group)

    def _rollouts(self, kept: list[Group]) -> Rollouts:
        rows = [g.row for g in kept]
        results = [g.results[0] for g in kept]
        chosen = [g.scores for g in kept]
        merged = {k: torch.cat([s[k] for s in chosen]) for k in chosen[0]} if chosen else {}
        return Rollouts(rows, results, merged)

    # -- the weights -----------------------------------------------------------------
    def on_weights(self, version: int, changed: bool = True) -> dict[str, float]:
        """The trainer is at ``version`` now; ``changed``: its weights differ from
        the replicas' and are pushed (with whole-batch admission, once the batch in
        flight is back). Returns the push's metrics, if it happened now."""
        metrics: dict[str, float] = {}
        if changed and self.producer is None and self.ahead:
            self.waiting = version
        elif changed:
            metrics = self.weights.push(version, interrupt=self.admission.interrupt)
        if self.producer is not None:
            self.producer.fill(version)
        return metrics

    def current_weights(self) -> None:
        """Push a version still waiting now (it queues behind the batch in flight):
        for held-out figures of the latest weights."""
        if self.waiting is not None:
            self.weights.push(self.waiting)
            self.waiting = None

    def step_metrics(self, metrics: dict[str, float]) -> None:
        """Group admission's ``async/*`` figures after the step."""
        if self.producer is None:
            return
        metrics["async/dropped_stale"] = float(self.dropped_stale)
        metrics["async/buffer_groups"] = float(len(self.producer.ready))
        metrics["async/inflight_groups"] = float(len(self.producer.inflight))
        if self.limit is not None:
            self.steer(metrics)
        metrics["async/max_inflight"] = float(self.producer.max_inflight)
        metrics["async/trimmed_groups"] = float(self.producer.trimmed)

    def steer(self, metrics: dict[str, float]) -> None:
        """``async.max_inflight=auto``: the next step's limit from this step's trainer
        wait, the engines' KV-cache peak and preemptions, the stale drops and the
        samples it trained a second."""
        assert self.limit is not None and self.producer is not None
        step_s = max(time.perf_counter() - self._step_start, 1e-9)
        preempted = metrics.get("rollout/preemptions", 0.0)
        limit = self.limit.steer(
            wait_share=self._wait_s / step_s,
            kv_peak=metrics.get("rollout/kv_cache_usage_peak", 0.0),
            preempted=preempted - self._seen[0],
            stale=self.dropped_stale - self._seen[1],
            rate=metrics.get("data/samples", 0.0) / step_s,
        )
        self._seen = (preempted, self.dropped_stale)
        self.producer.set_limit(limit)  # a higher one admits more at the next take

    # -- resume and the end ------------------------------------------------------------
    def state_dict(self) -> InFlight | None:
        """What a checkpoint keeps of the generation in flight (None: nothing).
        Whole batches: the next one, waited for; groups: the stream position."""
        if self.producer is not None:
            unsaved = len(self.producer.inflight) + len(self.producer.ready)
            return {"stream": self.stream.state_dict(), "unsaved_groups": unsaved}
        if not self.ahead:
            return None
        batch = self.ahead[0]
        state: InFlight = {"step": batch.step, "stream": batch.stream_before}
        if self.collector.agent is None:  # episodes are generated again
            state["results"] = results_to_json(batch.ref.result())
        return state

    def load_state_dict(self, state: InFlight | None) -> None:
        """A checkpoint's ``state_dict`` (the stream is restored by the caller)."""
        if not state:
            return
        if self.producer is not None:
            if state.get("unsaved_groups"):
                log.warning(
                    "fully_async: %d prompt group(s) were generating or buffered at the "
                    "checkpoint, which does not keep them: their prompts are skipped",
                    state["unsaved_groups"],
                )
        elif state.get("step") == self.first and "results" in state:
            self.restored = results_from_json(state["results"])

    def close(self) -> int:
        """Stop generating; returns the prompt groups sent and not trained."""
        if self.producer is not None:
            left = self.producer.close()
        else:
            left = sum(len(b.rows) for b in self.ahead)
            self.ahead.clear()
        if left:
            log.info("stopped with %d prompt group(s) not trained", left)
        return left


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
