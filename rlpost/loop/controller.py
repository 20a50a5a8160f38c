"""The RL loop: generate, score, log-probs, advantages, update, sync.

The controller holds no tensor math; it moves data between the rollout
replica, the reward functions, ``algos`` and the training worker groups
(policy, and where the algorithm needs them a frozen reference policy, a
critic and ``algo=opd``'s teacher, ``rlpost.loop.distill``). Sending prompts and scoring samples is the ``Collector``'s
(``rlpost.loop.collect``); checkpoints, restarts and stops are the
``Recovery``'s (``rlpost.loop.recovery``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from ray.exceptions import RayActorError

from rlpost.algos import compute_advantages, kl_reward_penalty
from rlpost.config.groups import PREFERENCE_PRESETS
from rlpost.data.images import row_images
from rlpost.data.rows import PromptStream
from rlpost.data.samples import episode_rows, rollout_batch
from rlpost.data.tasks import task_correctness
from rlpost.loop.best import BestPolicy
from rlpost.loop.collect import Collector, Pending, Rollouts
from rlpost.loop.distill import Distillation
from rlpost.loop.memory import colocated_memory
from rlpost.loop.preference import PreferenceSteps
from rlpost.loop.recovery import Recovery
from rlpost.loop.roles import TrainerGroups, Workers
from rlpost.loop.sample_log import SampleLog, sample_rows
from rlpost.loop.step_metrics import (
    clip_ratio,
    logprob_parity,
    results_from_json,
    results_to_json,
    staleness_metrics,
    whole_step,
)
from rlpost.loop.streaming import GroupProducer
from rlpost.loop.tracking import Tracker
from rlpost.loop.validation import held_out_metrics
from rlpost.plan.algo import kl_controller
from rlpost.plan.plan import RunPlan
from rlpost.result import RunResult
from rlpost.rewards.scoring import RewardScorer
from rlpost.rollout.base import GenerationResult
from rlpost.serving.weight_group import collective_sync
from rlpost.trainers.batch import TrajectoryBatch

log = logging.getLogger(__name__)


class Controller:
    def __init__(
        self,
        plan: RunPlan,
        run_dir: Path,
        workers: Workers,
        tokenizer: Any,
        scorer: RewardScorer,
        tracker: Tracker,
        rebuild_trainers: Callable[[], TrainerGroups] | None = None,
        stop_requested: Callable[[], int | None] | None = None,
        agent: Any = None,
        image_inputs: Any = None,
    ):
        """``rebuild_trainers`` and ``stop_requested``: see ``Recovery``; ``agent`` an
        ``AgentRollout`` (samples are multi-turn episodes); ``image_inputs`` a VL
        model's image processor (``rlpost.models.vl_inputs``)."""
        cfg = plan.cfg
        self.cfg, self.run_dir, self.workers = cfg, run_dir, workers
        self.collective = collective_sync(cfg, plan.device.kind, workers.rollout)
        self.memory = colocated_memory(cfg, plan.device.kind, workers.rollout)
        self.tokenizer, self.tracker = tokenizer, tracker
        self.val_rows = plan.val_rows
        self.agent, self.image_inputs = agent, image_inputs
        self.stream = PromptStream(
            plan.train_rows, seed=cfg.trainer.seed, batch_size=cfg.data.prompts_per_step
        )
        self.malformed_rows = plan.malformed_rows + self.stream.num_malformed
        self.long_prompts = plan.long_prompts
        self.dropped_chars = plan.dropped_chars
        self.algo = plan.algo
        self.loss_cfg, self.sampling = plan.algo.loss, plan.algo.sampling
        self.kl_ctl = kl_controller(cfg)
        self.collector = Collector(
            cfg, plan.algo, self.stream, workers.rollout, tokenizer, scorer, agent
        )
        self.recovery = Recovery(
            cfg, run_dir, workers, self.stream, self.kl_ctl, tracker, self.sync_weights,
            rebuild_trainers, stop_requested,
        )  # fmt: skip
        self.dropout = workers.policy.has_dropout()  # the policy's training forward is random
        self.in_flight: Pending | None = None  # one_step_off: the next step's generation
        self.producer: GroupProducer | None = None  # fully_async: the groups streaming
        self.recovery.in_flight = self.in_flight_state
        self.version = 0  # the policy version: steps whose update is done
        self.dropped_stale = 0  # fully_async: samples past async.max_staleness, so far
        self.samples = SampleLog(run_dir, cfg.trainer.log_samples, tracker.wandb_run)
        self.preference: PreferenceSteps | None = None  # algo=dpo, algo=rm: offline pairs
        if cfg.algo.name in PREFERENCE_PRESETS:
            self.preference = PreferenceSteps(
                cfg, workers, tokenizer, self.stream, self.val_rows, self.collector.request,
                self.sync_weights,
            )  # fmt: skip
        # algo=opd: the teacher's reverse KL is the advantage (rlpost.loop.distill)
        self.distill: Distillation | None = None
        if cfg.algo.needs_teacher:
            self.distill = Distillation(cfg, workers, self.sampling.temperature)
        # trainer.save_best: the policy at its best held-out figure (rlpost.loop.best)
        self.best = BestPolicy(run_dir, workers.policy.save_hf) if cfg.trainer.save_best else None
        # the task's own correctness, for val/accuracy when the reward has none (a reward model)
        self.task_correctness = task_correctness(cfg.data.name)

    def in_flight_state(self) -> dict[str, Any] | None:
        """What a checkpoint keeps of the next step's generation in one_step_off mode
        (waiting for it to finish): its step, its results and the prompt stream's
        state before its rows were drawn. Agent episodes are not kept: a resumed
        agent run generates that batch again, with the checkpoint's weights."""
        if self.producer is not None:  # fully_async: the buffer is not kept
            unsaved = len(self.producer.inflight) + len(self.producer.ready)
            return {"stream": self.stream.state_dict(), "unsaved_groups": unsaved}
        pending = self.in_flight
        if pending is None or self.agent is not None or pending.stream_before is None:
            return None
        results = pending.ref.result()
        return {
            "step": pending.step,
            "stream": pending.stream_before,
            "results": results_to_json(results),
        }

    # -- the loop ---------------------------------------------------------------
    def run(self) -> RunResult:
        t = self.cfg.trainer
        rec = self.recovery
        if self.preference is not None:
            self.preference.prepare()  # the pairs, before a checkpoint's stream state
        first = rec.restore() + 1
        rec.start_state = rec.driver_snapshot()
        if first == 1:
            metrics = self.validate(0)
            if self.best is not None:  # the starting policy may stay the best
                self.best.offer(0, metrics, self.tracker.history)
            self.tracker.log(0, metrics)
        while True:
            try:
                self.train_steps(first)
                break
            except RayActorError as exc:
                first = rec.restart_trainers(exc) + 1
        final = self.workers.policy.save_hf(str(self.run_dir / "final")) if t.save_final else None
        return RunResult(self.run_dir, self.tracker.history, final)

    def train_steps(self, first: int) -> None:
        """Steps ``first`` .. ``total_steps``: train, validate, log, checkpoint."""
        t = self.cfg.trainer
        offline = self.cfg.algo.name == "sft" or self.preference is not None
        mode = "sync" if offline else t.async_mode
        self.version = first - 1
        steps: Iterator[dict[str, float]]
        todo = range(first, t.total_steps + 1)
        if self.cfg.algo.name == "sft":
            steps = (self.sft_step(step) for step in todo)
        elif self.preference is not None:
            steps = (self.preference.step(step) for step in todo)
        elif mode == "one_step_off":
            steps = self.one_step_off_steps(first, t.total_steps)
        elif mode == "fully_async":
            steps = self.fully_async_steps(first, t.total_steps)
        else:
            steps = self.sync_steps(todo)
        try:
            self.log_steps(todo, steps, one_step_off=mode == "one_step_off")
        finally:
            close = getattr(steps, "close", None)
            if close is not None:
                close()  # a generator's own cleanup (fully_async: the producer stops)

    def log_steps(self, todo: range, steps: Iterator[dict[str, float]], one_step_off: bool) -> None:
        """Each step's metrics: validated, logged, checked; checkpoints and stops."""
        t, rec = self.cfg.trainer, self.recovery
        for step, metrics in zip(todo, steps):
            if (t.val_every and step % t.val_every == 0) or step == t.total_steps:
                if one_step_off and step < t.total_steps:
                    # The replica still has the previous weights; this load queues
                    # behind the generation in flight.
                    self.sync_weights()
                metrics.update(self.validate(step))
                if self.best is not None:
                    self.best.offer(step, metrics, self.tracker.history)
            metrics["trainer/restarts"] = float(rec.trainer_restarts)
            metrics.update(self.data_counts())
            self.tracker.log(step, metrics)
            rec.count_bad_step(step, metrics)
            if metrics.get("async/staleness_max", 0.0) == 0.0:
                # (a batch from older weights differs from the trainer's on purpose)
                rec.check_logprob_gap(step, metrics)
            saved = bool(t.save_every) and (step % t.save_every == 0 or step == t.total_steps)
            if saved:
                rec.save_checkpoint(step)
            rec.stop_if_requested(step, saved)

    def data_counts(self) -> dict[str, float]:
        """The rows dropped before training, by cause; every algorithm logs them each step
        (the warnings at load name these keys)."""
        return {
            "data/malformed_rows": float(self.malformed_rows),
            "data/dropped_chars": float(self.dropped_chars),
            "data/dropped_long_prompts": float(self.long_prompts),
        }

    def sync_steps(self, todo: range) -> Iterator[dict[str, float]]:
        """Generate, then train, then sync: the batch of step k comes from step k's weights."""
        for step in todo:
            start = time.perf_counter()
            pending = self.collector.launch(step)
            yield whole_step(self.rl_step(step, self.collector.wait_score_and_fill(pending)), start)

    def one_step_off_steps(self, first: int, total: int) -> Iterator[dict[str, float]]:
        """Generation of step k+1 overlaps the update of step k.

        The batch trained at step k was sampled with the weights the trainer had
        before step k-1's update: exactly one update stale (``rollout/staleness``).
        This generator is the only loop that decides when to stop; the rollout
        side is a single request in flight, joined here.
        """
        saved = self.recovery.restored_in_flight
        self.recovery.restored_in_flight = None
        kept = saved["results"] if saved and saved["step"] == first else None
        pending = self.collector.launch(first, results_from_json(kept) if kept else None)
        for step in range(first, total + 1):
            wait_start = iteration_start = time.perf_counter()
            rollouts, metrics = self.collector.wait_score_and_fill(pending)
            metrics["timing/generate_wait_s"] = time.perf_counter() - wait_start
            if step > 1:
                # The replica is idle now: give it the last update before it samples again.
                metrics["timing/weight_sync_s"] = self.sync_weights()
            next_pending = self.collector.launch(step + 1) if step < total else None
            self.in_flight = next_pending
            metrics = self.rl_step(step, (rollouts, metrics), sync=False)
            gen_s = metrics["timing/generate_s"]
            metrics["perf/overlap_frac"] = 1.0 - metrics["timing/generate_wait_s"] / max(
                gen_s, 1e-9
            )
            if next_pending is None:
                metrics["timing/weight_sync_s"] = self.sync_weights()
            metrics = whole_step(metrics, iteration_start)
            pending = next_pending  # type: ignore[assignment]
            yield metrics

    def fully_async_steps(self, first: int, total: int) -> Iterator[dict[str, float]]:
        """Rollouts stream for the whole run (``rlpost.loop.streaming``): up to
        ``async.max_inflight`` prompt groups generate while the trainer trains, each
        step takes the first ``data.prompts_per_step`` groups to finish within
        ``async.max_staleness``, and after each update the new weights reach the
        replicas at once (``async.partial_rollout``: interrupting the requests in
        flight, which continue under them). This generator is the only loop that
        decides when to stop; closing it stops the producer."""
        a, per_step = self.cfg.async_, self.cfg.data.prompts_per_step
        saved = self.recovery.restored_in_flight
        self.recovery.restored_in_flight = None
        if saved and saved.get("unsaved_groups"):
            log.warning(
                "fully_async: %d prompt group(s) were generating or buffered at the "
                "checkpoint, which does not keep them: their prompts are skipped",
                saved["unsaved_groups"],
            )
        producer = GroupProducer(
            self.stream.next_batch, self.collector.submit_group, per_step,
            max_inflight=a.max_inflight or 2 * per_step, max_staleness=a.max_staleness,
            first_batch=first,
        )  # fmt: skip
        self.producer = producer
        try:
            producer.fill(self.version)
            for step in range(first, total + 1):
                start = time.perf_counter()
                rollouts, metrics, _ = self.collector.take(producer, self.version)
                metrics["async/trainer_wait_s"] = time.perf_counter() - start
                producer.fill(self.version)  # what the take freed, before the update
                self.dropped_stale += int(metrics.pop("async/dropped_stale"))
                metrics = self.rl_step(step, (rollouts, metrics), sync=False)
                if self.updates_policy(step):
                    metrics["timing/weight_sync_s"] = self.sync_weights(interrupt=a.partial_rollout)
                producer.fill(self.version)
                metrics["async/dropped_stale"] = float(self.dropped_stale)
                metrics["async/buffer_groups"] = float(len(producer.ready))
                metrics["async/inflight_groups"] = float(len(producer.inflight))
                if "perf/rollout_idle_frac" in metrics:
                    metrics["async/rollout_idle_frac"] = metrics["perf/rollout_idle_frac"]
                yield whole_step(metrics, start)
        finally:
            left = producer.close()
            self.producer = None
            if left:
                log.info("fully_async: stopped with %d prompt group(s) not trained", left)

    def rl_step(
        self, step: int, collected: tuple[Rollouts, dict[str, float]], sync: bool = True
    ) -> dict[str, float]:
        rollouts, metrics = collected
        if not rollouts.rows:  # every group agreed in every round: nothing to learn from
            rounds = metrics.get("dapo/gen_rounds", 1.0)
            log.warning(
                "step %d: no update: the rewards of every group agreed in all %d generation "
                "round(s) (dapo/dropped_groups=%d); raise algo.dynamic_sampling.max_rounds or "
                "rollout.n, or check that the reward can tell the samples apart",
                step, rounds, metrics.get("dapo/dropped_groups", 0.0),
            )  # fmt: skip
            return metrics
        batch = rollout_batch(
            rollouts.results, self.tokenizer.pad_token_id, multiple=self.algo.group_multiple
        )
        batch.scores_b = {k: episode_rows(v, batch) for k, v in rollouts.scores.items()}
        if self.image_inputs is not None:  # each sample carries its prompt's images
            per_prompt = [self.image_inputs(row_images(row)) for row in rollouts.rows]
            assert batch.group_ids_b is not None
            batch.mm_inputs_b = [per_prompt[g] for g in batch.group_ids_b.tolist()]
        if self.cfg.algo.filter_truncated:
            metrics["response/filtered_truncated"] = self.filter_truncated(batch, rollouts.results)

        if sync and self.memory is not None:  # the trainer has the device to itself
            metrics.update(self.memory.before_training())
        t0 = time.perf_counter()
        self.compute_logprobs(batch, metrics, step)
        metrics["timing/logprob_s"] = time.perf_counter() - t0
        self.compute_advantages(batch, metrics)
        if self.samples.enabled:
            self.samples.write("step", step, sample_rows(
                step, rollouts.rows, rollouts.results, rollouts.scores, self.samples.limit,
                batch.advantages_bt, batch.response_mask_bt,
            ))  # fmt: skip
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
        metrics.update(staleness_metrics(rollouts.results, self.version))
        if self.updates_policy(step):
            metrics.update(self.update_policy(batch))
        self.version = step
        if sync and self.memory is not None:  # asleep replicas always take the weights back
            metrics.update(self.memory.after_training(self.sync_weights))
        elif sync and self.updates_policy(step):
            metrics["timing/weight_sync_s"] = self.sync_weights()
        tokens = float(batch.response_mask_bt.sum())
        metrics["perf/gen_tokens_per_s"] = tokens / max(metrics["timing/generate_s"], 1e-9)
        metrics["response/length_mean"] = tokens / batch.real_samples
        metrics["data/samples"] = float(batch.real_samples)
        metrics["response/clip_ratio"] = clip_ratio(rollouts.results)
        metrics.update(self.workers.rollout.stats())
        return metrics

    def sft_step(self, step: int) -> dict[str, float]:
        from rlpost.data.samples import sft_batch

        start = time.perf_counter()
        batch = sft_batch(self.tokenizer, self.stream.next_batch())
        metrics = self.workers.policy.update_sft(batch)
        self.version = step
        metrics["timing/weight_sync_s"] = self.sync_weights()
        metrics["timing/step_s"] = time.perf_counter() - start
        metrics["perf/tokens_per_s"] = (
            float(batch.attention_mask_bt.sum()) / metrics["timing/step_s"]
        )
        return metrics

    # -- the named steps ----------------------------------------------------------
    def filter_truncated(self, batch: TrajectoryBatch, results: list[GenerationResult]) -> float:
        """No loss on completions that hit max_tokens (DAPO's overlong filtering)."""
        truncated = torch.tensor(
            [c.finish_reason == "length" for r in results for c in r.completions]
        )
        truncated = episode_rows(truncated, batch)  # an episode's segments share its fate
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

        Not forcing it: ``algo.off_policy`` (the update computes the weight from
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
            self.algo.advantage,
            scores_b=scores,
            group_ids_b=batch.group_ids_b,
            mask_bt=mask,
            token_rewards_bt=token_rewards,
            values_bt=batch.old_values_bt,
            owner_b=batch.owner_b,
        )
        if self.distill is not None:  # the teacher scores the samples token by token
            self.distill.apply(batch, metrics)

    def update_policy(self, batch: TrajectoryBatch) -> dict[str, float]:
        """The policy update; the off-policy correction of ``algo.off_policy`` is
        applied inside it. Without old log-probs in the batch, they come from the
        update's own forward (``needs_old_logprobs``), and so do the parity metrics."""
        kwargs = dict(
            loss_cfg=self.loss_cfg,
            temperature=self.sampling.temperature,
            norm_const=float(self.collector.response_budget),
            reg=self.algo.reg,
            off_policy=self.algo.off_policy,
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

    def sync_weights(self, version: int | None = None, interrupt: bool = False) -> float:
        """The policy's weights to every replica, as policy ``version`` (default: the
        steps done); ``interrupt``: requests in flight continue under them."""
        start = time.perf_counter()
        if version is not None:
            self.version = version
        rollout = self.workers.rollout
        if self.cfg.model.lora.rank and self.cfg.rollout.lora_sync == "adapter":
            rollout.load_lora_adapter(self.workers.policy.adapter_ref(), self.version, interrupt)
        elif self.collective is not None:
            rollout.weight_sync_metrics = rollout.load_weights_collective(
                self.collective, self.workers.policy, self.version, interrupt
            )
        else:
            rollout.load_weights(self.workers.policy.weights_ref(), self.version, interrupt)
        return time.perf_counter() - start

    def validate(self, step: int) -> dict[str, float]:
        """The held-out figures after ``step`` (``rlpost.loop.validation``)."""
        return held_out_metrics(self, step)
