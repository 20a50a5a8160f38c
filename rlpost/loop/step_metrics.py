"""Metrics of one step computed from its samples and timings, and its generations as
plain JSON (what a checkpoint keeps of a batch in flight)."""

from __future__ import annotations

import time

from rlpost.loop.collect import sampled_versions
from rlpost.rollout.base import Completion, GenerationResult
from rlpost.trainers.batch import TrajectoryBatch


def logprob_parity(batch: TrajectoryBatch) -> dict[str, float]:
    """Trainer vs rollout log-probs of the sampled tokens: a broken weight sync shows here."""
    assert batch.old_logp_bt is not None and batch.rollout_logp_bt is not None
    mask = batch.response_mask_bt.bool()
    diff = (batch.old_logp_bt - batch.rollout_logp_bt).abs()[mask]
    return {
        "rollout/logprob_abs_diff_max": float(diff.max()) if diff.numel() else 0.0,
        "rollout/logprob_abs_diff_mean": float(diff.mean()) if diff.numel() else 0.0,
    }


def clip_ratio(results: list[GenerationResult]) -> float:
    """The fraction of samples cut at a token limit: a completion that reached
    ``rollout.max_tokens``, or an agent episode with a model turn that reached its
    limit (``agent.max_turn_tokens``, or what the episode's budget left) -- also
    one the episode went on after, whose call or answer the model never finished."""
    cut = [
        c.finish_reason == "length" or (c.episode is not None and c.episode.turns_cut > 0)
        for r in results
        for c in r.completions
    ]
    return sum(cut) / max(len(cut), 1)


def whole_step(metrics: dict[str, float], start: float) -> dict[str, float]:
    """Step time and throughput over the whole iteration, generation included."""
    metrics["timing/step_s"] = time.perf_counter() - start
    if "data/samples" in metrics:
        tokens = metrics["response/length_mean"] * metrics["data/samples"]
        metrics["perf/tokens_per_s"] = tokens / metrics["timing/step_s"]
    return metrics


def results_to_json(results: list[GenerationResult]) -> list[dict]:
    """Single-turn results as JSON (floats round-trip exactly)."""
    return [
        {
            "prompt_ids": r.prompt_ids,
            "completions": [
                {
                    "token_ids": c.token_ids,
                    "logprobs": c.logprobs,
                    "text": c.text,
                    "finish_reason": c.finish_reason,
                    "mask": c.mask,
                    "prompt_ids": c.prompt_ids,
                    "versions": c.versions,
                }
                for c in r.completions
            ],
        }
        for r in results
    ]


def results_from_json(rows: list[dict]) -> list[GenerationResult]:
    return [
        GenerationResult(r["prompt_ids"], [Completion(**c) for c in r["completions"]]) for r in rows
    ]


def staleness_metrics(results: list[GenerationResult], version: int) -> dict[str, float]:
    """How many updates behind the trainer (at ``version``) each sampled token is,
    and the share of samples whose tokens span more than one version (partial
    rollouts). ``rollout/staleness`` is the mean, as earlier releases reported it."""
    lags = [version - v for v in sampled_versions(results) if v >= 0]
    spans = [
        len({v for v in (c.versions or []) if v >= 0}) > 1 for r in results for c in r.completions
    ]
    mean = sum(lags) / len(lags) if lags else 0.0
    return {
        "async/staleness_mean": mean,
        "async/staleness_max": float(max(lags, default=0)),
        "async/partial_frac": sum(spans) / len(spans) if spans else 0.0,
        "rollout/staleness": mean,
    }
