"""The offline preference presets' steps: ``algo=dpo`` (a policy on pairs, against
a frozen reference) and ``algo=rm`` (a Bradley-Terry reward model).

Nothing is sampled during training. ``data=arith_pref`` samples its pairs once,
at the start of the run, from the base policy on the rollout replica the run
starts anyway: chosen is the right sum, rejected a sampled answer that is wrong
(``SAMPLES_PER_PROMPT``), so the pairs lie on the policy's own distribution; for
``algo=rm`` every prompt also gets its near misses as rejected answers
(``rlpost.data.tasks.arith.near_misses``). Data files hold the pairs themselves
(``rlpost.data.preference``).

Held-out figures: ``val/pair_accuracy`` (rm: share of held-out pairs the model
scores chosen above rejected) and ``val/rewards/*`` (dpo: the implicit rewards of
the held-out pairs); the controller adds the greedy accuracy for dpo where the
held-out rows carry answers (``data=arith_pref``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING

import torch

from rlpost.algos import PreferenceConfig, build_preference_loss, sequence_logps
from rlpost.algos.spec import narrow
from rlpost.config.groups import Config
from rlpost.data.preference import (
    is_preference_row,
    near_miss_pairs,
    preference_batch,
    sampled_pairs,
)
from rlpost.data.rows import DataError, PromptStream
from rlpost.data.tasks import task_correctness
from rlpost.loop.roles import Workers
from rlpost.rollout.base import SamplingConfig
from rlpost.serving.weight_sync import WeightSync
from rlpost.trainers.batch import TrajectoryBatch
from rlpost.trainers.preference import REF_LOGPS

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from rlpost.serving.agent_episodes import PendingEpisodes
    from rlpost.serving.pending import PendingGeneration

log = logging.getLogger(__name__)

# Sampled answers per prompt. dpo: the first wrong one is rejected (one pair per
# prompt); rm: every distinct wrong one (more negatives per prompt for the ranking).
SAMPLES_PER_PROMPT = {"dpo": 2, "rm": 4}
REF_KEY = "_ref_logps"  # a pair row's precomputed reference log-probs (chosen, rejected)


def preference_config(cfg: Config) -> PreferenceConfig:
    """``algo.dpo`` as the preference loss takes it (without the loop's own key)."""
    return narrow(cfg.algo.dpo, PreferenceConfig)


class PreferenceSteps:
    """``prepare`` (the pairs, and the reference log-probs where precomputed), one
    ``step`` per optimizer step, ``validate`` on the held-out pairs."""

    def __init__(
        self,
        cfg: Config,
        workers: Workers,
        tokenizer: PreTrainedTokenizerBase,
        stream: PromptStream,
        val_rows: list[dict],
        request: Callable[
            [list[dict], SamplingConfig, int | None], PendingGeneration | PendingEpisodes
        ],
        weights: WeightSync,
    ):
        self.cfg, self.workers, self.tokenizer = cfg, workers, tokenizer
        self.stream, self.val_rows, self.request = stream, val_rows, request
        self.weights = weights
        self.is_rm = cfg.algo.name == "rm"
        self.pref = None if self.is_rm else preference_config(cfg)
        spec = None if self.pref is None else build_preference_loss(self.pref)
        self.spec = spec
        self.needs_reference = spec is not None and spec.needs_reference
        self.val_pairs = [r for r in val_rows if is_preference_row(r)]
        # dpo on rows with answers (data=arith_pref): greedy accuracy as for RL
        self.generates = not self.is_rm and not self.val_pairs
        self.num_pairs = 0

    # -- the pairs -------------------------------------------------------------------
    def prepare(self) -> None:
        """Sample ``data=arith_pref``'s pairs; precompute reference log-probs."""
        if self.cfg.data.name == "arith_pref":
            start = time.perf_counter()
            t, pps = self.cfg.trainer, self.cfg.data.prompts_per_step
            # about one pass over fresh pairs (a prompt yields one when a sample is
            # wrong, which for the built-in base policy is most of them)
            rows = self.stream.rows[: max(t.total_steps * pps, 4 * pps)]
            train = self.sample_pairs(rows, seed=1)
            self.val_pairs = self.sample_pairs(self.val_rows, seed=2)
            if not train or not self.val_pairs:
                raise DataError(
                    "data=arith_pref: the base policy answered every sampled prompt right; "
                    "there are no wrong answers to reject (lower model.warmup.target_accuracy)"
                )
            self.stream.replace_rows(train)
            log.info(
                "data=arith_pref: %d training and %d held-out pairs from %d sampled prompts "
                "in %.1f s", len(train), len(self.val_pairs), len(rows) + len(self.val_rows),
                time.perf_counter() - start,
            )  # fmt: skip
        self.num_pairs = len(self.stream.rows)
        if self.needs_reference and self.cfg.algo.dpo.precompute_ref:
            start = time.perf_counter()
            self.attach_reference(self.stream.rows)
            log.info(
                "algo.dpo.precompute_ref: reference log-probs of %d pairs in %.1f s",
                len(self.stream.rows), time.perf_counter() - start,
            )  # fmt: skip
        if self.needs_reference and self.val_pairs:
            self.attach_reference(self.val_pairs)  # the reference is frozen: once

    def sample_pairs(self, rows: list[dict], seed: int) -> list[dict]:
        """Pairs of the built-in task's ``rows``: the answer against a wrong sample."""
        from rlpost.data.tasks.arith import answer_text, near_misses

        r, n = self.cfg.rollout, SAMPLES_PER_PROMPT[self.cfg.algo.name]
        sampling = SamplingConfig(
            n=n, temperature=r.temperature, top_p=r.top_p, max_tokens=r.max_tokens
        )
        results = self.request(rows, sampling, seed).result()
        texts = [[c.text for c in res.completions] for res in results]
        correct = task_correctness(self.cfg.data.name)
        assert correct is not None  # data=arith_pref: the arith task's own check
        pairs = sampled_pairs(rows, texts, correct, answer_text, every_wrong=self.is_rm)
        if self.is_rm:  # and the near misses a policy would find unranked otherwise
            pairs += near_miss_pairs(rows, near_misses)
        return pairs

    def attach_reference(self, rows: list[dict], chunk: int = 256) -> None:
        """Each pair row's reference log-probs, kept in the row (``REF_KEY``)."""
        for start in range(0, len(rows), chunk):
            part = rows[start : start + chunk]
            ref_b = self.reference_logps(preference_batch(self.tokenizer, part))
            for i, row in enumerate(part):
                row[REF_KEY] = (float(ref_b[2 * i]), float(ref_b[2 * i + 1]))

    def reference_logps(self, batch: TrajectoryBatch) -> torch.Tensor:
        """The frozen reference's summed response log-probs (b,): its own worker group,
        or under LoRA the policy with its adapter disabled."""
        w = self.workers
        if w.reference is not None:
            logp_bt = w.reference.logprobs(batch, temperature=1.0)
        else:
            logp_bt = w.policy.ref_logprobs(batch, temperature=1.0)
        assert self.spec is not None
        return sequence_logps(logp_bt, batch.response_mask_bt, self.spec.length_normalised)

    def batch(self, rows: list[dict]) -> TrajectoryBatch:
        batch = preference_batch(self.tokenizer, rows)
        if self.needs_reference:
            if all(REF_KEY in r for r in rows):
                batch.scores_b[REF_LOGPS] = torch.tensor([v for r in rows for v in r[REF_KEY]])
            else:
                batch.scores_b[REF_LOGPS] = self.reference_logps(batch)
        return batch

    # -- steps -------------------------------------------------------------------------
    def steps(self, first: int, last: int) -> Generator[dict[str, float], None, None]:
        for step in range(first, last + 1):
            yield self.step(step)

    def step(self, step: int) -> dict[str, float]:
        start = time.perf_counter()
        rows = self.stream.next_batch()
        batch = self.batch(rows)
        policy = self.workers.policy
        if self.is_rm:
            coef = self.cfg.algo.rm.center_rewards_coef
            metrics = policy.update_reward_model(batch, center_coef=coef)
        else:
            assert self.pref is not None  # every preset but algo=rm has a preference loss
            metrics = policy.update_preference(batch, cfg=self.pref)
            metrics.update(self.weights.push(step))
        metrics["timing/step_s"] = time.perf_counter() - start
        metrics["perf/tokens_per_s"] = (
            float(batch.attention_mask_bt.sum()) / metrics["timing/step_s"]
        )
        metrics["data/pairs"] = float(self.num_pairs)
        return metrics

    def validate(self) -> dict[str, float]:
        """The held-out pairs' figures (none without held-out pairs)."""
        if not self.val_pairs:
            return {}
        batch = self.batch(self.val_pairs)
        if self.is_rm:
            r_b = self.workers.policy.rewards(batch)
            chosen, rejected = r_b[0::2], r_b[1::2]
            return {
                "val/pair_accuracy": float((chosen > rejected).float().mean()),
                "val/reward_margin": float((chosen - rejected).mean()),
            }
        assert self.spec is not None and self.pref is not None
        logp_bt = self.workers.policy.logprobs(batch, temperature=1.0)
        seq_b = sequence_logps(logp_bt, batch.response_mask_bt, self.spec.length_normalised)
        ref_b = batch.scores_b.get(REF_LOGPS)
        ref_c, ref_r = (None, None) if ref_b is None else (ref_b[0::2], ref_b[1::2])
        loss, metrics = self.spec.fn(
            seq_b[0::2], seq_b[1::2], ref_c, ref_r, self.pref, len(self.val_pairs)
        )
        out = {f"val/{k}": float(v) for k, v in metrics.items()}
        out["val/dpo/loss"] = float(loss)  # the training loss's name, held out
        return out
