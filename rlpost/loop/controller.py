"""The run: one recipe's steps with validation, logging, checkpoints and stops.

The RL loop is the controller's own recipe. Each step reads top to bottom:
take scored groups from the rollout source (``rlpost.loop.source``; sync,
one_step_off and fully_async are its settings) -> batch -> log-probs ->
advantages -> update -> the new policy version to the source, which pushes the
weights through the run's one weight sync (``rlpost.serving.weight_sync``) when
its admission allows. SFT (``rlpost.loop.sft``) and the preference presets
(``rlpost.loop.preference``) are recipes of their own run by the same loop.

The controller holds no tensor math; it moves data between the rollout
replicas, the reward functions, ``algos`` and the training worker groups
(policy, and where the algorithm needs them a frozen reference policy, a
critic and ``algo=opd``'s teacher, ``rlpost.loop.distill``). Requests and
scores are the ``Collector``'s (``rlpost.loop.collect``); checkpoints, restarts
and stops the ``Recovery``'s (``rlpost.loop.recovery``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from ray.exceptions import RayActorError

from rlpost.algos import compute_advantages, kl_reward_penalty
from rlpost.config.groups import PREFERENCE_PRESETS
from rlpost.data.curriculum import Curriculum
from rlpost.data.images import row_images
from rlpost.data.rows import PromptStream
from rlpost.data.samples import episode_rows, rollout_batch
from rlpost.data.tasks import task_correctness
from rlpost.loop.best import BestPolicy
from rlpost.loop.collect import Collector, Rollouts
from rlpost.loop.distill import Distillation
from rlpost.loop.memory import colocated_memory
from rlpost.loop.preference import PreferenceSteps
from rlpost.loop.recovery import Recovery
from rlpost.loop.roles import TrainerGroups, Workers
from rlpost.loop.sample_log import SampleLog, sample_rows
from rlpost.loop.sft import SftSteps
from rlpost.loop.source import Admission, RolloutSource
from rlpost.loop.step_metrics import clip_ratio, logprob_parity, staleness_metrics, whole_step
from rlpost.loop.timeline import Timeline, trace_level
from rlpost.loop.tracking import Tracker
from rlpost.loop.validation import held_out_metrics
from rlpost.plan.algo import kl_controller
from rlpost.plan.plan import RunPlan
from rlpost.result import RunResult
from rlpost.rewards.scoring import Scorer
from rlpost.rollout.base import GenerationResult
from rlpost.runtime.spans import add as add_span
from rlpost.runtime.spans import span, traced
from rlpost.serving.weight_sync import weight_sync
from rlpost.trainers.batch import TrajectoryBatch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from rlpost.models.vl_inputs import ImageInputs
    from rlpost.serving.agent_episodes import AgentRollout

log = logging.getLogger(__name__)


class Controller:
    def __init__(
        self,
        plan: RunPlan,
        run_dir: Path,
        workers: Workers,
        tokenizer: PreTrainedTokenizerBase,
        scorer: Scorer,
        tracker: Tracker,
        rebuild_trainers: Callable[[], TrainerGroups] | None = None,
        stop_requested: Callable[[], int | None] | None = None,
        agent: AgentRollout | None = None,
        image_inputs: ImageInputs | None = None,
    ):
        """``rebuild_trainers`` and ``stop_requested``: see ``Recovery``; ``agent`` an
        ``AgentRollout`` (samples are multi-turn episodes); ``image_inputs`` a VL
        model's image processor (``rlpost.models.vl_inputs``)."""
        cfg = plan.cfg
        self.cfg, self.run_dir, self.workers = cfg, run_dir, workers
        memory = colocated_memory(cfg, plan.device.kind, workers.rollout)
        self.weights = weight_sync(cfg, plan.device.kind, workers, memory)
        self.tokenizer, self.tracker = tokenizer, tracker
        self.val_rows = plan.val_rows
        self.agent, self.image_inputs = agent, image_inputs
        d = cfg.data  # data.curriculum: prompts every group agrees on are skipped
        curriculum = Curriculum(d.curriculum, d.curriculum_window, d.curriculum_return,
                                cfg.trainer.seed) if d.curriculum != "none" else None  # fmt: skip
        self.stream = PromptStream(
            plan.train_rows,
            seed=cfg.trainer.seed,
            batch_size=cfg.data.prompts_per_step,
            needs_prompt=cfg.agent.program is None,
            curriculum=curriculum,
        )
        self.malformed_rows = plan.malformed_rows + self.stream.num_malformed
        self.long_prompts = plan.long_prompts
        self.dropped_chars = plan.dropped_chars
        self.algo = plan.algo
        self.loss_cfg, self.sampling = plan.algo.loss, plan.algo.sampling
        self.kl_ctl = kl_controller(cfg)
        self.collector = Collector(cfg, plan.algo, workers.rollout, tokenizer, scorer, agent)
        self.recovery = Recovery(
            cfg, run_dir, workers, self.stream, self.kl_ctl, tracker, self.weights.push,
            rebuild_trainers, stop_requested,
        )  # fmt: skip
        self.dropout = workers.policy.has_dropout()  # the policy's training forward is random
        self.version = 0  # the policy version: steps whose update is done
        self.source: RolloutSource | None = None  # the RL steps' samples, while they run
        self.recovery.in_flight = lambda: self.source.state_dict() if self.source else None
        self.samples = SampleLog(run_dir, cfg.trainer.log_samples, tracker.wandb_run)
        # The steps: the RL loop's own, or a recipe of offline data (SFT, preference pairs).
        self.recipe: SftSteps | PreferenceSteps | Controller = self
        self.preference: PreferenceSteps | None = None  # algo=dpo, algo=rm: offline pairs
        if cfg.algo.name in PREFERENCE_PRESETS:
            self.preference = PreferenceSteps(
                cfg, workers, tokenizer, self.stream, self.val_rows, self.collector.request,
                self.weights,
            )  # fmt: skip
            self.recipe = self.preference
        elif cfg.algo.name == "sft":
            self.recipe = SftSteps(workers, tokenizer, self.stream, self.weights)
        # algo=opd: the teacher's reverse KL is the advantage (rlpost.loop.distill)
        self.distill: Distillation | None = None
        if cfg.algo.needs_teacher:
            self.distill = Distillation(cfg, workers, self.sampling.temperature)
        # trainer.save_best: the policy at its best held-out figure (rlpost.loop.best)
        self.best = BestPolicy(run_dir, workers.policy.save_hf) if cfg.trainer.save_best else None
        # the task's own correctness, for val/accuracy when the reward has none (a reward model)
        self.task_correctness = task_correctness(cfg.data.name)
        # trainer.trace: every process's spans in run_dir/trace.json (rlpost.loop.timeline)
        self.timeline = Timeline(trace_level(cfg.trainer.trace), run_dir, workers)

    # -- the loop ---------------------------------------------------------------
    def run(self) -> RunResult:
        t = self.cfg.trainer
        rec = self.recovery
        if self.preference is not None:
            self.preference.prepare()  # the pairs, before a checkpoint's stream state
        first = rec.restore() + 1
        rec.start_state = rec.driver_snapshot()
        self.timeline.open(first - 1)
        try:
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
            final = self.save_final() if t.save_final else None
        except BaseException:
            self.timeline.close(collect=False)  # a worker may be gone: what is here is kept
            raise
        self.timeline.close()
        return RunResult(self.run_dir, self.tracker.history, final)

    @traced("save_final")
    def save_final(self) -> str | None:
        return self.workers.policy.save_hf(str(self.run_dir / "final"))

    def train_steps(self, first: int) -> None:
        """Steps ``first`` .. ``total_steps`` of the recipe: train, validate, log,
        checkpoint."""
        todo = range(first, self.cfg.trainer.total_steps + 1)
        steps = self.recipe.steps(first, self.cfg.trainer.total_steps)
        try:
            self.log_steps(todo, steps)
        finally:
            steps.close()  # the generator's own cleanup (the RL loop: its source stops)

    def log_steps(self, todo: range, steps: Iterator[dict[str, float]]) -> None:
        """Each step's metrics: validated, logged, checked; checkpoints and stops."""
        for step in todo:
            start = time.time()
            metrics = next(steps, None)
            if metrics is None:
                return
            try:
                self.finish_step(step, metrics)
            finally:  # the step's own span: its trainer and rollout spans fall inside it
                add_span("step", start, time.time(), step=step, version=self.version)

    def finish_step(self, step: int, metrics: dict[str, float]) -> None:
        """After the recipe's step: validate, log, trace, check, checkpoint, stop."""
        t, rec = self.cfg.trainer, self.recovery
        if (t.val_every and step % t.val_every == 0) or step == t.total_steps:
            if self.source is not None:  # a version waiting behind a batch in flight
                self.source.current_weights()
            metrics.update(self.validate(step))
            if self.best is not None:
                self.best.offer(step, metrics, self.tracker.history)
        metrics["trainer/restarts"] = float(rec.trainer_restarts)
        metrics.update(self.data_counts())
        with span("trace"):
            metrics.update(self.timeline.collect())
        with span("log"):
            self.tracker.log(step, metrics)
        rec.count_bad_step(step, metrics)
        if metrics.get("async/staleness_max", 0.0) == 0.0:
            # (a batch from older weights differs from the trainer's on purpose)
            rec.check_logprob_gap(step, metrics)
        saved = bool(t.save_every) and (step % t.save_every == 0 or step == t.total_steps)
        if saved:
            with span("checkpoint"):
                rec.save_checkpoint(step)
        rec.stop_if_requested(step, saved)

    def data_counts(self) -> dict[str, float]:
        """The rows dropped before training, by cause; every algorithm logs them each step
        (the warnings at load name these keys)."""
        counts = {
            "data/malformed_rows": float(self.malformed_rows),
            "data/dropped_chars": float(self.dropped_chars),
            "data/dropped_long_prompts": float(self.long_prompts),
        }
        if self.stream.curriculum is not None:
            counts.update(self.stream.curriculum.metrics())
        return counts

    def steps(self, first: int, last: int) -> Generator[dict[str, float], None, None]:
        """The RL loop: each step takes scored groups from the rollout source and
        trains on them (``rl_step``). The source's admission is
        ``trainer.async_mode`` (``rlpost.loop.source``); this generator is the only
        loop that decides when to stop, and closing it stops the source."""
        self.version = first - 1
        source = RolloutSource(
            self.cfg, self.collector, self.stream, self.weights, Admission.of(self.cfg), first, last
        )
        source.load_state_dict(self.recovery.restored_in_flight)
        self.recovery.restored_in_flight = None
        self.source = source
        try:
            for step in range(first, last + 1):
                start = time.perf_counter()
                with span("take_rollouts", step=step):
                    rollouts, metrics = source.take(step, self.version)
                yield whole_step(self.rl_step(step, rollouts, metrics), start)
        finally:
            source.close()
            self.source = None

    def rl_step(self, step: int, rollouts: Rollouts, metrics: dict[str, float]) -> dict[str, float]:
        """One step on the groups the source gave: batch, log-probs, advantages,
        update, then the new weights to the source (which pushes them when its
        admission allows)."""
        if not rollouts.rows:  # every group agreed in every round: nothing to learn from
            rounds = metrics.get("dapo/gen_rounds", 1.0)
            log.warning(
                "step %d: no update: the rewards of every group agreed in all %d generation "
                "round(s) (dapo/dropped_groups=%d); raise algo.dynamic_sampling.max_rounds or "
                "rollout.n, or check that the reward can tell the samples apart",
                step, rounds, metrics.get("dapo/dropped_groups", 0.0),
            )  # fmt: skip
            self.tell_source(metrics, changed=False)
            return metrics
        batch = self.batch(rollouts, metrics)
        with span("release_rollout"):
            metrics.update(self.weights.release())  # colocated replicas sleep while we train
        t0 = time.perf_counter()
        self.compute_logprobs(batch, metrics, step)
        metrics["timing/logprob_s"] = time.perf_counter() - t0
        self.compute_advantages(batch, metrics)
        if self.samples.enabled:
            self.samples.write("step", step, sample_rows(
                step, rollouts.rows, rollouts.results, rollouts.scores, self.samples.limit,
                batch.advantages_bt, batch.response_mask_bt,
            ))  # fmt: skip
        metrics.update(staleness_metrics(rollouts.results, self.version))
        self.update(step, batch, metrics)
        self.version = step
        # asleep replicas always take the weights back, updated or not
        self.tell_source(metrics, changed=self.updates_policy(step) or self.weights.asleep)
        tokens = float(batch.response_mask_bt.sum())
        metrics["perf/gen_tokens_per_s"] = tokens / max(metrics["timing/generate_s"], 1e-9)
        metrics["response/length_mean"] = tokens / batch.real_samples
        metrics["data/samples"] = float(batch.real_samples)
        metrics["response/clip_ratio"] = clip_ratio(rollouts.results)
        with span("step_figures"):
            metrics.update(self.workers.rollout.stats())
            metrics.update(self.weights.figures)
            if self.source is not None:
                self.source.step_metrics(metrics)
        return metrics

    @traced("tell_source")
    def tell_source(self, metrics: dict[str, float], changed: bool) -> None:
        """The policy version after this step to the rollout source."""
        if self.source is not None:
            metrics.update(self.source.on_weights(self.version, changed))

    # -- the named steps ----------------------------------------------------------
    @traced("batch")
    def batch(self, rollouts: Rollouts, metrics: dict[str, float]) -> TrajectoryBatch:
        """The groups as one padded batch: scores by sample, images, DAPO's
        truncation filter."""
        batch = rollout_batch(
            rollouts.results, self.tokenizer.pad_token_id, multiple=self.algo.group_multiple
        )
        batch.scores_b = {k: episode_rows(v, batch) for k, v in rollouts.scores.items()}
        if self.image_inputs is not None:  # each sample carries its prompt's images
            # A text-only row's images are None, which ImageInputs does not declare: the
            # call is as it was before it was typed (the SFT path skips such rows).
            per_prompt = [
                self.image_inputs(row_images(row))  # type: ignore[arg-type]
                for row in rollouts.rows
            ]
            assert batch.group_ids_b is not None
            batch.mm_inputs_b = [per_prompt[g] for g in batch.group_ids_b.tolist()]
        if self.cfg.algo.filter_truncated:
            metrics["response/filtered_truncated"] = self.filter_truncated(batch, rollouts.results)
        return batch

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

    @traced("compute_logprobs")
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

    @traced("compute_advantages")
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

    @traced("update")
    def update(self, step: int, batch: TrajectoryBatch, metrics: dict[str, float]) -> None:
        """The critic's update, then the policy's (not during ``trainer.critic_warmup``)."""
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

    def update_policy(self, batch: TrajectoryBatch) -> dict[str, float]:
        """The policy update; the off-policy correction of ``algo.off_policy`` is
        applied inside it. Without old log-probs in the batch, they come from the
        update's own forward (``needs_old_logprobs``), and so do the parity metrics."""
        policy, a = self.workers.policy, self.algo
        temperature, norm_const = self.sampling.temperature, float(self.collector.response_budget)
        if batch.old_logp_bt is not None:
            return policy.update_policy(
                batch, a.loss, temperature=temperature, epochs=self.cfg.algo.epochs,
                mini_batches=self.cfg.algo.mini_batches, norm_const=norm_const, reg=a.reg,
                off_policy=a.off_policy,
            )  # fmt: skip
        metrics, batch.old_logp_bt = policy.update_policy_single_pass(
            batch, a.loss, temperature=temperature, norm_const=norm_const, reg=a.reg,
            off_policy=a.off_policy,
        )  # fmt: skip
        metrics.update(logprob_parity(batch))
        return metrics

    @traced("validate")
    def validate(self, step: int) -> dict[str, float]:
        """The held-out figures after ``step`` (``rlpost.loop.validation``)."""
        return held_out_metrics(self, step)
