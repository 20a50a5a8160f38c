"""The held-out figures a run logs (``trainer.val_every``): greedy accuracy and
mean reward, sampled pass@k and friends (``trainer.val_n``), the preference
presets' pair figures and SFT's held-out NLL."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from rlpost.config.groups import Config
from rlpost.evaluation.metrics import validation_metrics
from rlpost.loop.collect import Collector
from rlpost.loop.preference import PreferenceSteps
from rlpost.loop.roles import Workers
from rlpost.loop.sample_log import SampleLog, sample_rows
from rlpost.rollout.base import SamplingConfig

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from rlpost.models.vl_inputs import ImageInputs


class Run(Protocol):
    """What the held-out figures read of a run (the controller has it all)."""

    cfg: Config
    collector: Collector
    samples: SampleLog
    sampling: SamplingConfig
    val_rows: list[dict]
    preference: PreferenceSteps | None
    task_correctness: Callable[[str, dict], float] | None
    image_inputs: ImageInputs | None
    tokenizer: PreTrainedTokenizerBase
    workers: Workers


def held_out_metrics(ctrl: Run, step: int) -> dict[str, float]:
    """Greedy completions of the held-out prompts, scored by the reward:
    ``val/reward_mean`` always, ``val/accuracy`` only where the reward has a
    correctness signal (a named reward ``correctness``, as the built-in tasks'),
    never a mean reward under another name; where the reward has none (a reward
    model) on a built-in task, the task's own correctness gives ``val/accuracy``.
    The preference presets add their held-out pairs' figures (``algo=rm``: those
    alone). ``step``: the step it follows."""
    start = time.perf_counter()
    pairs = ctrl.preference.validate() if ctrl.preference is not None else {}
    if ctrl.preference is not None and not ctrl.preference.generates:
        return {**pairs, "timing/val_s": time.perf_counter() - start}
    greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=ctrl.sampling.max_tokens)
    results = ctrl.collector.request(ctrl.val_rows, greedy, seed=None).result()
    scores, metrics = ctrl.collector.score(results, ctrl.val_rows, repeat=1)
    if ctrl.samples.enabled:
        ctrl.samples.write(
            "val", step, sample_rows(step, ctrl.val_rows, results, scores, ctrl.samples.limit)
        )
    sampled = sampled_metrics(ctrl) if ctrl.cfg.trainer.val_n > 1 else {}
    out = {
        "val/reward_mean": float(scores["total"].mean()),
        "val/reward_errors": metrics["reward/errors"],
        "timing/val_s": time.perf_counter() - start,
    }
    if "correctness" in scores:
        out["val/accuracy"] = float(scores["correctness"].mean())
    elif ctrl.task_correctness is not None:  # e.g. a reward model: the task's own check
        texts = [c.text for r in results for c in r.completions]
        right = [ctrl.task_correctness(x, row) for x, row in zip(texts, ctrl.val_rows)]
        out["val/accuracy"] = sum(right) / max(len(right), 1)
    if ctrl.cfg.algo.name == "sft" and ctrl.image_inputs is None:
        out["val/nll"] = heldout_nll(ctrl)
    return {**out, **sampled, **pairs}


def sampled_metrics(ctrl: Run) -> dict[str, float]:
    """``trainer.val_n`` samples of each held-out prompt at the run's sampling
    temperature: val/mean@n, val/pass@k, val/maj@<val_n> (``rlpost.evaluation``)."""
    n = ctrl.cfg.trainer.val_n
    sampling = dataclasses.replace(ctrl.sampling, n=n)
    results = ctrl.collector.request(ctrl.val_rows, sampling, seed=None).result()
    scores, _ = ctrl.collector.score(results, ctrl.val_rows, repeat=n)
    return validation_metrics(
        ctrl.val_rows, results, scores, n, ctrl.cfg.eval.correct_threshold,
        ctrl.collector.scorer,
    )  # fmt: skip


def heldout_nll(ctrl: Run) -> float:
    """SFT: the policy's token-mean negative log-likelihood of the held-out rows'
    targets (their ``messages``' assistant turns, ``response``, else ``answer``),
    the training loss's own measure on data it does not train on."""
    from rlpost.data.samples import sft_batch

    rows = [
        r if "messages" in r or "response" in r else {**r, "response": str(r["answer"])}
        for r in ctrl.val_rows
        if "messages" in r or "response" in r or "answer" in r
    ]
    batch = sft_batch(ctrl.tokenizer, rows)
    logp_bt = ctrl.workers.policy.logprobs(batch, temperature=1.0)
    mask_bt = batch.response_mask_bt.float()
    return float(-(logp_bt * mask_bt).sum() / mask_bt.sum().clamp(min=1.0))
