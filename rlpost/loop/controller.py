"""The RL loop: generate, score, log-probs, advantages, update, sync.

The controller holds no tensor math; it moves data between the rollout
replica, the reward functions, ``algos`` and the training worker groups
(policy, and where the algorithm needs them a frozen reference policy and a
critic).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from ray.exceptions import RayActorError

from rlpost.algos import (
    AdaptiveKLController,
    AdvantageConfig,
    FixedKLController,
    PolicyLossConfig,
    compute_advantages,
    kl_reward_penalty,
    overlong_penalty,
    zero_std_groups,
)
from rlpost.config.groups import Config
from rlpost.data.images import row_images
from rlpost.data.rows import PromptStream
from rlpost.data.samples import encode_prompt, rollout_batch
from rlpost.loop.checkpoint import (
    CheckpointManager,
)
from rlpost.loop.recovery import Recovery
from rlpost.loop.result import RunResult
from rlpost.loop.tracking import Tracker
from rlpost.rewards.scoring import RewardScorer
from rlpost.rollout.base import GenerationRequest, GenerationResult, SamplingConfig
from rlpost.serving.pending import PendingGeneration
from rlpost.serving.rollout_group import RolloutGroup
from rlpost.trainers.batch import TrajectoryBatch
from rlpost.trainers.fsdp import RegularizerConfig
from rlpost.workers.trainer_worker import TrainerGroup

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Workers:
    policy: TrainerGroup
    rollout: RolloutGroup
    reference: TrainerGroup | None = None
    critic: TrainerGroup | None = None


TrainerGroups = tuple[TrainerGroup, TrainerGroup | None, TrainerGroup | None]


@dataclasses.dataclass
class Pending:
    """A generation in flight: the step it is for, its prompt rows, the pending results."""

    step: int
    rows: list[dict]
    ref: PendingGeneration
    start: float


@dataclasses.dataclass
class Rollouts:
    """What one step generated: prompt rows, results (one per prompt) and scores."""

    rows: list[dict]
    results: list[GenerationResult]
    scores: dict[str, torch.Tensor]


class Controller(Recovery):
    def __init__(
        self,
        cfg: Config,
        run_dir: Path,
        workers: Workers,
        tokenizer: Any,
        train_rows: list[dict],
        val_rows: list[dict],
        scorer: RewardScorer,
        tracker: Tracker,
        malformed_rows: int,
        rebuild_trainers: Callable[[], TrainerGroups] | None = None,
        stop_requested: Callable[[], int | None] | None = None,
        agent: Any = None,
        image_inputs: Any = None,
    ):
        """``rebuild_trainers`` closes the trainer groups and starts new ones (policy,
        reference, critic) after a rank died; ``stop_requested`` returns the signal
        that asked the run to stop, polled between steps."""
        self.cfg, self.run_dir, self.workers = cfg, run_dir, workers
        self.rebuild_trainers, self.stop_requested = rebuild_trainers, stop_requested
        self.trainer_restarts = 0
        self.resumed_from: Path | None = None
        self.tokenizer, self.scorer, self.tracker = tokenizer, scorer, tracker
        self.val_rows = val_rows
        self.agent = agent  # an AgentRollout: samples are multi-turn episodes (agent.*)
        self.image_inputs = image_inputs  # a VL model's image processor (rlpost.models.vl_inputs)
        self.ckpt = CheckpointManager(run_dir, cfg.trainer.keep_last)
        self.stream = PromptStream(
            train_rows, seed=cfg.trainer.seed, batch_size=cfg.data.prompts_per_step
        )
        self.malformed_rows = malformed_rows + self.stream.num_malformed
        a = cfg.algo
        self.adv_cfg = AdvantageConfig(
            estimator=a.advantage.estimator,
            norm_by_std=a.advantage.norm_by_std,
            eps=a.advantage.eps,
            gamma=a.advantage.gamma,
            lam=a.advantage.lam,
            reward_weights=tuple(cfg.reward.weights.items()),
        )
        p = a.policy_loss
        self.loss_cfg = PolicyLossConfig(
            name=p.name, clip_low=p.clip_low, clip_high=p.clip_high, clip_c=p.clip_c, agg=p.agg
        )
        self.reg = RegularizerConfig(
            kl_coef=a.kl.loss_coef, kl_type=a.kl.loss_type, entropy_coef=a.entropy_coef
        )
        self.kl_ctl = (
            AdaptiveKLController(a.kl.reward_coef, a.kl.target, a.kl.horizon)
            if a.kl.adaptive
            else FixedKLController(a.kl.reward_coef)
        )
        r = cfg.rollout
        self.sampling = SamplingConfig(
            n=r.n,
            temperature=r.temperature,
            top_p=r.top_p,
            max_tokens=r.max_tokens,
            min_tokens=r.min_tokens,
        )
        # Samples per step must split over ranks and mini-batches.
        self.group_multiple = cfg.trainer.world_size * a.mini_batches
        self.bad_steps = 0  # updates skipped in a row (NaN/Inf)
        self.dropout = workers.policy.has_dropout()  # the policy's training forward is random

    # -- the loop ---------------------------------------------------------------
    def run(self) -> RunResult:
        t = self.cfg.trainer
        first = self.restore() + 1
        self.start_state = self.driver_snapshot()
        if first == 1:
            self.tracker.log(0, self.validate())
        while True:
            try:
                self.train_steps(first)
                break
            except RayActorError as exc:
                first = self.restart_trainers(exc) + 1
        final = self.workers.policy.save_hf(str(self.run_dir / "final")) if t.save_final else None
        return RunResult(self.run_dir, self.tracker.history, final)

    def train_steps(self, first: int) -> None:
        """Steps ``first`` .. ``total_steps``: train, validate, log, checkpoint."""
        t = self.cfg.trainer
        one_step_off = t.async_mode == "one_step_off" and self.cfg.algo.name != "sft"
        steps: Iterator[dict[str, float]]
        todo = range(first, t.total_steps + 1)
        if self.cfg.algo.name == "sft":
            steps = (self.sft_step(step) for step in todo)
        elif one_step_off:
            steps = self.one_step_off_steps(first, t.total_steps)
        else:
            steps = self.sync_steps(todo)
        for step, metrics in zip(todo, steps):
            if (t.val_every and step % t.val_every == 0) or step == t.total_steps:
                if one_step_off and step < t.total_steps:
                    # The replica still has the previous weights; this load queues
                    # behind the generation in flight.
                    self.sync_weights()
                metrics.update(self.validate())
            metrics["trainer/restarts"] = float(self.trainer_restarts)
            self.tracker.log(step, metrics)
            self.count_bad_step(step, metrics)
            if not one_step_off:  # there the batch comes from the weights before the last update
                self.check_logprob_gap(step, metrics)
            saved = bool(t.save_every) and (step % t.save_every == 0 or step == t.total_steps)
            if saved:
                self.save_checkpoint(step)
            self.stop_if_requested(step, saved)

    def sync_steps(self, todo: range) -> Iterator[dict[str, float]]:
        """Generate, then train, then sync: the batch of step k comes from step k's weights."""
        for step in todo:
            start = time.perf_counter()
            yield _whole_step(self.rl_step(step, self.collect(step)), start)

    def one_step_off_steps(self, first: int, total: int) -> Iterator[dict[str, float]]:
        """Generation of step k+1 overlaps the update of step k.

        The batch trained at step k was sampled with the weights the trainer had
        before step k-1's update: exactly one update stale (``rollout/staleness``).
        This generator is the only loop that decides when to stop; the rollout
        side is a single request in flight, joined here.
        """
        pending = self.launch(first)
        for step in range(first, total + 1):
            wait_start = iteration_start = time.perf_counter()
            rollouts, metrics = self.finish(pending)
            metrics["timing/generate_wait_s"] = time.perf_counter() - wait_start
            metrics["rollout/staleness"] = float(step > 1)
            if step > 1:
                # The replica is idle now: give it the last update before it samples again.
                metrics["timing/weight_sync_s"] = self.sync_weights()
            next_pending = self.launch(step + 1) if step < total else None
            metrics = self.rl_step(step, (rollouts, metrics), sync=False)
            gen_s = metrics["timing/generate_s"]
            metrics["perf/overlap_frac"] = 1.0 - metrics["timing/generate_wait_s"] / max(
                gen_s, 1e-9
            )
            if next_pending is None:
                metrics["timing/weight_sync_s"] = self.sync_weights()
            metrics = _whole_step(metrics, iteration_start)
            pending = next_pending  # type: ignore[assignment]
            yield metrics

    def rl_step(
        self, step: int, collected: tuple[Rollouts, dict[str, float]], sync: bool = True
    ) -> dict[str, float]:
        start = time.perf_counter()
        rollouts, metrics = collected
        if not rollouts.rows:
            metrics["timing/step_s"] = time.perf_counter() - start
            return metrics  # every group agreed in every round: nothing to learn from
        batch = rollout_batch(rollouts.results, self.tokenizer.pad_token_id)
        batch.scores_b = rollouts.scores
        if self.image_inputs is not None:  # each sample carries its prompt's images
            per_prompt = [self.image_inputs(row_images(row)) for row in rollouts.rows]
            assert batch.group_ids_b is not None
            batch.mm_inputs_b = [per_prompt[g] for g in batch.group_ids_b.tolist()]
        if self.cfg.algo.filter_truncated:
            metrics["response/filtered_truncated"] = self.filter_truncated(batch, rollouts.results)

        t0 = time.perf_counter()
        self.compute_logprobs(batch, metrics, step)
        metrics["timing/logprob_s"] = time.perf_counter() - t0
        self.compute_advantages(batch, metrics)
        if self.workers.critic is not None:
            metrics.update(
                self.workers.critic.update_critic(
                    batch,
                    value_clip=self.cfg.algo.value_clip,
                    agg=self.loss_cfg.agg,
                    epochs=self.cfg.algo.epochs,
                    mini_batches=self.cfg.algo.mini_batches,
                )
            )
        if self.updates_policy(step):
            metrics.update(self.update_policy(batch))
            if sync:
                metrics["timing/weight_sync_s"] = self.sync_weights()
        metrics["timing/step_s"] = time.perf_counter() - start
        tokens = float(batch.response_mask_bt.sum())
        metrics["perf/tokens_per_s"] = tokens / metrics["timing/step_s"]
        metrics["perf/gen_tokens_per_s"] = tokens / max(metrics["timing/generate_s"], 1e-9)
        metrics["response/length_mean"] = tokens / len(batch)
        metrics["data/samples"] = float(len(batch))
        metrics["response/clip_ratio"] = _clip_ratio(rollouts.results)
        metrics["data/malformed_rows"] = float(self.malformed_rows)
        metrics.update(self.workers.rollout.stats())
        return metrics

    def sft_step(self, step: int) -> dict[str, float]:
        from rlpost.data.samples import sft_batch

        start = time.perf_counter()
        batch = sft_batch(self.tokenizer, self.stream.next_batch())
        metrics = self.workers.policy.update_sft(batch)
        metrics["timing/weight_sync_s"] = self.sync_weights()
        metrics["timing/step_s"] = time.perf_counter() - start
        metrics["perf/tokens_per_s"] = (
            float(batch.attention_mask_bt.sum()) / metrics["timing/step_s"]
        )
        return metrics

    # -- the named steps ----------------------------------------------------------
    def collect(self, step: int) -> tuple[Rollouts, dict[str, float]]:
        return self.finish(self.launch(step))

    def launch(self, step: int) -> Pending:
        """Start generating one step's prompts; returns at once."""
        rows = self.stream.next_batch()
        return Pending(
            step, rows, self.request(rows, self.sampling, step * 1000), time.perf_counter()
        )

    def finish(self, pending: Pending) -> tuple[Rollouts, dict[str, float]]:
        """Wait for ``pending`` and score it; with dynamic sampling (DAPO), drop groups
        whose rewards all agree and generate more, up to ``max_rounds`` rounds."""
        ds = self.cfg.algo.dynamic_sampling
        want = self.cfg.data.prompts_per_step
        rows: list[dict] = []
        results: list[GenerationResult] = []
        scores: list[dict[str, torch.Tensor]] = []
        metrics: dict[str, float] = {}
        gen_s, rounds, dropped = 0.0, 0, 0
        round_pending: Pending | None = pending
        while round_pending is not None:
            rounds += 1
            round_rows = round_pending.rows
            round_results = round_pending.ref.result()
            gen_s += time.perf_counter() - round_pending.start
            round_scores, round_metrics = self.score(round_results, round_rows, self.sampling.n)
            if self.cfg.algo.overlong.enabled:
                round_metrics.update(self.shape_overlong(round_results, round_scores))
            if rounds == 1:
                metrics.update(round_metrics)
            keep_g = torch.ones(len(round_rows), dtype=torch.bool)
            if ds.enabled:
                groups_b = torch.arange(len(round_rows)).repeat_interleave(self.sampling.n)
                keep_g = zero_std_groups(round_scores["total"], groups_b)[:: self.sampling.n]
                dropped += int((~keep_g).sum())
            for g in torch.nonzero(keep_g).flatten().tolist():
                rows.append(round_rows[g])
                results.append(round_results[g])
                sl = slice(g * self.sampling.n, (g + 1) * self.sampling.n)
                scores.append({k: v[sl] for k, v in round_scores.items()})
            round_pending = None
            if ds.enabled and len(rows) < want and rounds < ds.max_rounds:
                more = self.stream.next_batch()
                seed = pending.step * 1000 + rounds
                round_pending = Pending(
                    pending.step, more, self.request(more, self.sampling, seed), time.perf_counter()
                )
        keep = min(len(rows), want)
        while keep and (keep * self.sampling.n) % self.group_multiple:
            keep -= 1
        merged = {k: torch.cat([s[k] for s in scores[:keep]]) for k in scores[0]} if keep else {}
        metrics["timing/generate_s"] = gen_s
        if ds.enabled:
            metrics["dapo/dropped_groups"] = float(dropped)
            metrics["dapo/gen_rounds"] = float(rounds)
            metrics["dapo/kept_groups"] = float(keep)
        return Rollouts(rows[:keep], results[:keep], merged), metrics

    def request(self, rows: list[dict], sampling: SamplingConfig, seed: int | None) -> Any:
        """Send ``rows`` to the rollout; returns a reference to the results."""
        if seed is not None:
            sampling = dataclasses.replace(sampling, seed=self.cfg.trainer.seed * 100_003 + seed)
        if self.agent is not None:
            return self.agent.launch(rows, sampling)
        requests = [
            GenerationRequest(
                prompt_ids=encode_prompt(self.tokenizer, row),
                sampling=sampling,
                images=row_images(row),
            )
            for row in rows
        ]
        return self.workers.rollout.generate_async(requests)

    def generate(
        self, rows: list[dict], sampling: SamplingConfig, seed: int | None
    ) -> tuple[list[GenerationResult], float]:
        start = time.perf_counter()
        results = self.request(rows, sampling, seed).result()
        return results, time.perf_counter() - start

    def score(
        self, results: list[GenerationResult], rows: list[dict], repeat: int
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        flat_rows = [row for row in rows for _ in range(repeat)]
        if self.agent is not None:
            from rlpost.serving.agent_episodes import score_episodes

            named_only = self.adv_cfg.estimator == "gdpo"
            return score_episodes(self.scorer, results, flat_rows, named_only=named_only)
        texts = [c.text for res in results for c in res.completions]
        named, metrics = self.scorer.score(texts, flat_rows)
        scores = {k: torch.tensor(v, dtype=torch.float32) for k, v in named.items()}
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

    def filter_truncated(self, batch: TrajectoryBatch, results: list[GenerationResult]) -> float:
        """No loss on completions that hit max_tokens (DAPO's overlong filtering)."""
        truncated = torch.tensor(
            [c.finish_reason == "length" for r in results for c in r.completions]
        )
        batch.response_mask_bt[truncated] = 0
        return float(truncated.float().mean())

    def updates_policy(self, step: int) -> bool:
        """PPO's first ``critic_warmup`` steps train only the critic."""
        return step > self.cfg.trainer.critic_warmup or self.workers.critic is None

    def needs_old_logprobs(self, step: int) -> bool:
        """Whether the old log-probs need a forward pass of their own before the update.

        Otherwise the update is one optimizer step over the whole batch with the
        weights that sampled it, so its own log-probs, detached, are the old ones
        (ratio 1, the same loss and gradient) and one forward pass is saved. What
        forces the separate pass:

        - ``algo.epochs > 1`` or ``algo.mini_batches > 1``: every optimizer step
          after the first needs the log-probs from before the first;
        - ``algo.kl.reward_coef > 0`` (ppo, reinforce_pp): the KL penalty in the
          reward is computed from them before the advantages, so before the update;
        - a critic during ``trainer.critic_warmup``: the policy is not updated, and
          the rollout parity check still needs the trainer's log-probs;
        - dropout in the policy (``model.lora.dropout > 0``, or the model's own): a
          training-mode forward is not the policy that sampled.

        Not forcing it: ``algo.rollout_is_cap`` (the update computes the weight from
        its own log-probs), the KL loss and the entropy bonus (reference and current
        log-probs), GAE (the critic's values), and every advantage estimator (they
        see scores, token rewards and values, never log-probs).
        """
        return (
            self.cfg.algo.old_logprobs_before_update
            or not self.updates_policy(step)
            or self.dropout
        )

    def compute_logprobs(
        self, batch: TrajectoryBatch, metrics: dict[str, float], step: int
    ) -> None:
        w = self.workers
        if self.needs_old_logprobs(step):
            batch.old_logp_bt = w.policy.logprobs(batch, temperature=self.sampling.temperature)
            metrics.update(logprob_parity(batch))
        if w.reference is not None:
            batch.ref_logp_bt = w.reference.logprobs(batch, temperature=self.sampling.temperature)
        elif self.cfg.algo.needs_reference:  # LoRA: the base model is the reference
            batch.ref_logp_bt = w.policy.ref_logprobs(batch, temperature=self.sampling.temperature)
        if w.critic is not None:
            batch.old_values_bt = w.critic.values(batch)

    def compute_advantages(self, batch: TrajectoryBatch, metrics: dict[str, float]) -> None:
        assert batch.group_ids_b is not None
        mask = batch.response_mask_bt.float()
        scores = dict(batch.scores_b)
        token_rewards = None
        if self.cfg.algo.kl.reward_coef > 0:
            assert batch.ref_logp_bt is not None and batch.old_logp_bt is not None
            token_rewards, scores["total"], kl_b = kl_reward_penalty(
                scores["total"], batch.old_logp_bt, batch.ref_logp_bt, mask,
                self.kl_ctl.value, self.cfg.algo.kl.reward_type,
            )  # fmt: skip
            metrics["actor/reward_kl"] = float(kl_b.mean())
            metrics["actor/kl_coef"] = self.kl_ctl.value
            self.kl_ctl.update(float(kl_b.mean()), len(batch))
        batch.advantages_bt, batch.returns_bt = compute_advantages(
            self.adv_cfg,
            scores_b=scores,
            group_ids_b=batch.group_ids_b,
            mask_bt=mask,
            token_rewards_bt=token_rewards,
            values_bt=batch.old_values_bt,
        )

    @property
    def response_budget(self) -> int:
        """The most response tokens a sample can have: one completion's, or a whole
        episode's in agent mode (DAPO's overlong limit, Dr.GRPO's loss constant)."""
        if self.agent is not None:
            return self.cfg.agent.max_response_tokens
        return self.sampling.max_tokens

    def update_policy(self, batch: TrajectoryBatch) -> dict[str, float]:
        """The policy update; the truncated importance weight of ``algo.rollout_is_cap``
        is applied inside it. Without old log-probs in the batch, they come from the
        update's own forward (``needs_old_logprobs``), and so do the parity metrics."""
        kwargs = dict(
            loss_cfg=self.loss_cfg,
            temperature=self.sampling.temperature,
            norm_const=float(self.response_budget),
            reg=self.reg,
            is_cap=self.cfg.algo.rollout_is_cap,
        )
        policy = self.workers.policy
        if batch.old_logp_bt is not None:
            a = self.cfg.algo
            return policy.update_policy(
                batch, epochs=a.epochs, mini_batches=a.mini_batches, **kwargs
            )
        metrics, batch.old_logp_bt = policy.update_policy_single_pass(batch, **kwargs)
        metrics.update(logprob_parity(batch))
        return metrics

    def sync_weights(self) -> float:
        start = time.perf_counter()
        if self.cfg.model.lora.rank and self.cfg.rollout.lora_sync == "adapter":
            self.workers.rollout.load_lora_adapter(self.workers.policy.adapter_ref())
        else:
            self.workers.rollout.load_weights(self.workers.policy.weights_ref())
        return time.perf_counter() - start

    def validate(self) -> dict[str, float]:
        """Greedy completions of the held-out prompts, scored by the reward."""
        start = time.perf_counter()
        greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=self.sampling.max_tokens)
        results, _ = self.generate(self.val_rows, greedy, seed=None)
        scores, metrics = self.score(results, self.val_rows, repeat=1)
        key = "correctness" if "correctness" in scores else "total"
        return {
            "val/accuracy": float(scores[key].mean()),
            "val/reward_mean": float(scores["total"].mean()),
            "val/reward_errors": metrics["reward/errors"],
            "timing/val_s": time.perf_counter() - start,
        }


def logprob_parity(batch: TrajectoryBatch) -> dict[str, float]:
    """Trainer vs rollout log-probs of the sampled tokens: a broken weight sync shows here."""
    assert batch.old_logp_bt is not None and batch.rollout_logp_bt is not None
    mask = batch.response_mask_bt.bool()
    diff = (batch.old_logp_bt - batch.rollout_logp_bt).abs()[mask]
    return {
        "rollout/logprob_abs_diff_max": float(diff.max()) if diff.numel() else 0.0,
        "rollout/logprob_abs_diff_mean": float(diff.mean()) if diff.numel() else 0.0,
    }


def _clip_ratio(results: list[GenerationResult]) -> float:
    finishes = [c.finish_reason for r in results for c in r.completions]
    return sum(f == "length" for f in finishes) / max(len(finishes), 1)


def _whole_step(metrics: dict[str, float], start: float) -> dict[str, float]:
    """Step time and throughput over the whole iteration, generation included."""
    metrics["timing/step_s"] = time.perf_counter() - start
    if "data/samples" in metrics:
        tokens = metrics["response/length_mean"] * metrics["data/samples"]
        metrics["perf/tokens_per_s"] = tokens / metrics["timing/step_s"]
    return metrics
