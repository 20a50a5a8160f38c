"""The RL loop: generate, score, log-probs, advantages, update, sync.

The controller holds no tensor math; it moves data between the rollout
replica, the reward functions, ``algos`` and the training worker group.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import ray
import torch

from algos import AdvantageConfig, PolicyLossConfig, compute_advantages
from rlpost.config import Config
from rlpost.data import PromptStream
from rlpost.result import RunResult
from rlpost.rewards import RewardScorer
from rlpost.samples import encode_prompt, rollout_batch
from rlpost.tracking import Tracker
from rlpost.workers.trainer_worker import TrainerGroup
from rollout.base import GenerationRequest, GenerationResult, SamplingConfig

log = logging.getLogger(__name__)


class Controller:
    def __init__(
        self,
        cfg: Config,
        run_dir: Path,
        model_path: str,
        trainer: TrainerGroup,
        rollout: Any,
        tokenizer: Any,
        train_rows: list[dict],
        val_rows: list[dict],
        scorer: RewardScorer,
        tracker: Tracker,
        malformed_rows: int,
    ):
        self.cfg, self.run_dir, self.model_path = cfg, run_dir, model_path
        self.trainer, self.rollout, self.tokenizer = trainer, rollout, tokenizer
        self.scorer, self.tracker = scorer, tracker
        self.val_rows = val_rows
        self.stream = PromptStream(
            train_rows, seed=cfg.trainer.seed, batch_size=cfg.data.prompts_per_step
        )
        self.malformed_rows = malformed_rows + self.stream.num_malformed
        a, p = cfg.algo.advantage, cfg.algo.policy_loss
        self.adv_cfg = AdvantageConfig(estimator=a.estimator, norm_by_std=a.norm_by_std, eps=a.eps)
        self.loss_cfg = PolicyLossConfig(
            name=p.name, clip_low=p.clip_low, clip_high=p.clip_high, clip_c=p.clip_c, agg=p.agg
        )
        r = cfg.rollout
        self.sampling = SamplingConfig(
            n=r.n, temperature=r.temperature, top_p=r.top_p, max_tokens=r.max_tokens
        )

    # -- the loop ---------------------------------------------------------------
    def run(self) -> RunResult:
        cfg = self.cfg.trainer
        self.tracker.log(0, self.validate())
        for step in range(1, cfg.total_steps + 1):
            metrics = self.train_step(step)
            due = cfg.val_every and step % cfg.val_every == 0
            if due or step == cfg.total_steps:
                metrics.update(self.validate())
            self.tracker.log(step, metrics)
        final = None
        if cfg.save_final:
            final = self.trainer.save_hf(str(self.run_dir / "final"))
        return RunResult(self.run_dir, self.tracker.history, final)

    def train_step(self, step: int) -> dict[str, float]:
        start = time.perf_counter()
        rows = self.stream.next_batch()
        results, t_gen = self.generate(rows, self.sampling, step)
        batch = rollout_batch(results, self.tokenizer.pad_token_id)
        scores, metrics = self.score(results, rows, repeat=self.sampling.n)
        batch.scores_b = scores

        t0 = time.perf_counter()
        batch.old_logp_bt = self.trainer.logprobs(batch, temperature=self.sampling.temperature)
        metrics.update(logprob_parity(batch))
        metrics["timing/logprob_s"] = time.perf_counter() - t0

        assert batch.group_ids_b is not None
        batch.advantages_bt, _ = compute_advantages(
            self.adv_cfg,
            scores_b=batch.scores_b,
            group_ids_b=batch.group_ids_b,
            mask_bt=batch.response_mask_bt.float(),
        )
        metrics.update(
            self.trainer.update_policy(
                batch,
                loss_cfg=self.loss_cfg,
                temperature=self.sampling.temperature,
                epochs=self.cfg.algo.epochs,
                mini_batches=self.cfg.algo.mini_batches,
                norm_const=float(self.sampling.max_tokens),
            )
        )
        metrics["timing/weight_sync_s"] = self.sync_weights()
        metrics["timing/generate_s"] = t_gen
        metrics["timing/step_s"] = time.perf_counter() - start
        tokens = float(batch.response_mask_bt.sum())
        metrics["perf/tokens_per_s"] = tokens / metrics["timing/step_s"]
        metrics["perf/gen_tokens_per_s"] = tokens / max(t_gen, 1e-9)
        metrics["response/length_mean"] = tokens / len(batch)
        metrics["response/clip_ratio"] = _clip_ratio(results)
        metrics["data/malformed_rows"] = float(self.malformed_rows)
        return metrics

    # -- the named steps ----------------------------------------------------------
    def generate(
        self, rows: list[dict], sampling: SamplingConfig, seed: int | None
    ) -> tuple[list[GenerationResult], float]:
        start = time.perf_counter()
        if seed is not None:
            sampling = dataclasses.replace(sampling, seed=self.cfg.trainer.seed * 100_003 + seed)
        requests = [
            GenerationRequest(prompt_ids=encode_prompt(self.tokenizer, row), sampling=sampling)
            for row in rows
        ]
        results = ray.get(self.rollout.generate.remote(requests))
        return results, time.perf_counter() - start

    def score(
        self, results: list[GenerationResult], rows: list[dict], repeat: int
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        texts = [c.text for res in results for c in res.completions]
        flat_rows = [row for row in rows for _ in range(repeat)]
        named, metrics = self.scorer.score(texts, flat_rows)
        scores = {k: torch.tensor(v, dtype=torch.float32) for k, v in named.items()}
        return scores, metrics

    def sync_weights(self) -> float:
        start = time.perf_counter()
        ray.get(self.rollout.load_weights.remote(self.trainer.weights_ref()))
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


def logprob_parity(batch) -> dict[str, float]:
    """Trainer vs rollout log-probs of the sampled tokens: a broken weight sync shows here."""
    mask = batch.response_mask_bt.bool()
    diff = (batch.old_logp_bt - batch.rollout_logp_bt).abs()[mask]
    return {
        "rollout/logprob_abs_diff_max": float(diff.max()) if diff.numel() else 0.0,
        "rollout/logprob_abs_diff_mean": float(diff.mean()) if diff.numel() else 0.0,
    }


def _clip_ratio(results: list[GenerationResult]) -> float:
    finishes = [c.finish_reason for r in results for c in r.completions]
    return sum(f == "length" for f in finishes) / max(len(finishes), 1)
