"""Rollout dumps: what the model wrote, next to what it was scored.

``trainer.log_samples=N`` writes, at every step, the step's first N samples
(group by group: the ``rollout.n`` samples of a prompt side by side) to
``<run_dir>/samples/step_XXXXXX.jsonl`` and the first N validation generations
to ``samples/val_XXXXXX.jsonl``, one JSON object a line:

- ``step``, ``group`` (the prompt's index in the step), ``prompt`` (its text or
  chat messages) and the row's ``answer`` / ``data_source`` where it has them;
- ``completion`` (the sampled text), or ``messages`` for a multi-turn episode
  (the whole chat) with its ``turns``;
- ``rewards``: every named score and the ``total``; ``advantage`` (the mean over
  the sample's trained tokens: one value for GRPO-style estimators, the mean of
  the per-token ones for GAE);
- ``length`` (response tokens), ``finish_reason`` and ``policy_version`` (the
  oldest update that sampled one of its tokens; null when the engine does not
  say).

With ``wandb`` among ``trainer.logger`` the same rows are logged as a table
(``samples/train``, ``samples/val``). Files are written whole to a temporary
name and renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import torch

from rlpost.rollout.base import GenerationResult

if TYPE_CHECKING:
    from wandb import Run

TABLE_COLUMNS = ("step", "group", "prompt", "completion", "total", "advantage", "length")


class Sample(TypedDict, total=False):
    """One sample of a dump (see the module docstring): a row's columns as they are,
    an episode's ``messages`` and ``turns`` or a single ``completion``."""

    step: int
    group: int
    prompt: object  # text or chat messages
    answer: object
    data_source: object
    messages: list[dict]
    turns: int
    completion: str
    rewards: dict[str, float]
    advantage: float
    length: int
    finish_reason: str
    policy_version: int | None


def sample_rows(
    step: int,
    rows: list[dict],
    results: list[GenerationResult],
    scores: dict[str, torch.Tensor],
    limit: int,
    advantages_bt: torch.Tensor | None = None,
    mask_bt: torch.Tensor | None = None,
) -> list[Sample]:
    """The first ``limit`` samples of a step as plain dicts (see the module
    docstring). ``rows``: one per prompt, ``results`` likewise; ``scores``: one
    value per sample under each name; ``advantages_bt`` and ``mask_bt`` the
    batch's, in the same sample order (b = samples, t = response tokens)."""
    out: list[Sample] = []
    b = 0
    for group, (row, result) in enumerate(zip(rows, results)):
        for completion in result.completions:
            if len(out) >= limit:
                return out
            sample: Sample = {"step": step, "group": group, "prompt": row.get("prompt")}
            if "answer" in row:
                sample["answer"] = row["answer"]
            if "data_source" in row:
                sample["data_source"] = row["data_source"]
            episode = completion.episode
            if episode is not None:
                sample["messages"] = episode.messages
                sample["turns"] = episode.num_turns
            else:
                sample["completion"] = completion.text
            sample["rewards"] = {k: float(v[b]) for k, v in scores.items()}
            if advantages_bt is not None and mask_bt is not None:
                mask_t = mask_bt[b].float()
                sample["advantage"] = float(
                    (advantages_bt[b] * mask_t).sum() / mask_t.sum().clamp(min=1.0)
                )
            trained = completion.mask
            sample["length"] = len(completion.token_ids) if trained is None else sum(trained)
            sample["finish_reason"] = completion.finish_reason
            versions = [v for v in (completion.versions or []) if v >= 0]
            sample["policy_version"] = min(versions) if versions else None
            out.append(sample)
            b += 1
    return out


class SampleLog:
    """Writes the dumps of ``trainer.log_samples`` under ``run_dir/samples``."""

    def __init__(self, run_dir: Path, limit: int, wandb_run: Run | None = None):
        self.dir = run_dir / "samples"
        self.limit, self.wandb_run = limit, wandb_run

    @property
    def enabled(self) -> bool:
        return self.limit > 0

    def write(self, kind: str, step: int, samples: list[Sample]) -> Path:
        """``samples/<kind>_XXXXXX.jsonl`` (``kind``: step or val), written atomically."""
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"{kind}_{step:06d}.jsonl"
        tmp = path.with_suffix(".jsonl.tmp")
        with open(tmp, "w") as f:
            for sample in samples:
                f.write(json.dumps(sample, default=str) + "\n")
        os.replace(tmp, path)
        if self.wandb_run is not None:
            self._table(self.wandb_run, kind, samples)
        return path

    def _table(self, run: Run, kind: str, samples: list[Sample]) -> None:
        import wandb

        table = wandb.Table(columns=list(TABLE_COLUMNS))
        for s in samples:
            text = s.get("completion")
            if text is None:
                text = json.dumps(s.get("messages"), default=str)
            prompt = s["prompt"] if isinstance(s["prompt"], str) else json.dumps(s["prompt"])
            table.add_data(
                s["step"], s["group"], prompt, text, s["rewards"].get("total"),
                s.get("advantage"), s["length"],
            )  # fmt: skip
        name = "samples/train" if kind == "step" else "samples/val"
        run.log({name: table}, step=samples[0]["step"] if samples else None)
