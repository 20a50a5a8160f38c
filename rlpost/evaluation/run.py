"""``evaluate(cfg)``: sample a trained model on the held-out prompts, score the
samples with the run's reward and write pass@k, mean@n, greedy accuracy and
maj@k (``rlpost.evaluation.metrics``) to ``eval.json`` and ``eval.md``.

It reads the training config: ``model.path``, the data's held-out rows
(``data.val_files``, or the built-in task's), ``reward.*`` and ``rollout.*``,
and the ``eval`` group. Everything that can fail on user input fails as one
config error before Ray starts; then only Ray and the rollout replicas start,
no trainer.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from rlpost.config.compose import compose_dict, from_dict, to_dict
from rlpost.config.groups import Config
from rlpost.config.schema import ConfigError
from rlpost.evaluation.metrics import Summary, judged_scores, prompt_samples, summarize
from rlpost.plan.plan import RunPlan, build_plan

if TYPE_CHECKING:
    from rlpost.rollout.base import GenerationResult

log = logging.getLogger(__name__)
# Prompts per call to the replicas: all are in flight at once (a replica batches
# whatever it has), the progress bar moves as each chunk comes back.
CHUNK = 8


@dataclass
class Scored:
    """The evaluated rows, their results (sampled; greedy, one per row or none) and
    the reward's scores: named, of the sampled completions in order; the greedy
    completions' judged scores; the scorer's metrics."""

    rows: list[dict]
    sampled: list[GenerationResult]
    greedy: list[GenerationResult]
    scores: dict[str, list[float]]
    greedy_scores: list[float] | None
    metrics: dict[str, float]


class EvalSummary(Summary):
    """eval.json: the model, the config keys the figures depend on, the score judged
    by, n and the k, ``summarize``'s figures, counts and the wall time."""

    model: str | None
    config: dict[str, object]
    score: str
    n: int
    k: list[int]
    counts: dict[str, int]
    wall_s: float


@dataclass
class EvalReport:
    """What ``evaluate`` wrote: the output folder, eval.json's content and the table."""

    output: Path
    summary: EvalSummary
    table: str


def compose_eval(overrides: list[str]) -> Config:
    """The config as ``python -m rlpost.eval`` reads it: the training config, where
    ``data=files`` needs only ``data.val_files`` (the training files default to them,
    so the training config's checks -- columns the reward names -- see those rows)."""
    raw = compose_dict(overrides)
    data = raw.get("data")
    # data=files leaves train_files as "???" (required) until it is set
    if (
        isinstance(data, dict)
        and data.get("name") == "files"
        and data.get("train_files") in (None, "???", [])
    ):
        val = data.get("val_files")
        data["train_files"] = val if isinstance(val, list) else []
    return from_dict(raw)


def eval_problems(cfg: Config) -> list[str]:
    """What the eval command needs beyond a valid training config."""
    problems = []
    if cfg.model.path is None:
        problems.append(
            "model.path: eval needs a trained model: a run's final folder (e.g. "
            "model.path=outputs/<run>/final, written with trainer.save_final=true) or an HF "
            "model folder or hub id; the built-in model without model.path is not trained"
        )
    if cfg.agent.enabled:
        problems.append(
            "agent.*: eval samples single completions; multi-turn agent episodes are not "
            "evaluated yet (drop the agent.* keys)"
        )
    return problems


def eval_plan(cfg: Config) -> RunPlan:
    """``build_plan``'s checks of the data, the reward and the model, together with
    the eval command's own, as one config error."""
    problems = eval_problems(cfg)
    try:
        plan = build_plan(cfg)
    except ConfigError as exc:
        raise ConfigError(problems + exc.problems) from exc
    if problems:
        raise ConfigError(problems)
    return plan


def output_dir(cfg: Config) -> Path:
    """``eval.output``, else ``<model.path>/eval`` for a local model, else
    ``outputs/eval-<time>``."""
    if cfg.eval.output:
        return Path(cfg.eval.output)
    model = Path(cfg.model.path or "").expanduser()
    if cfg.model.path and model.is_dir():
        return model / "eval"
    return Path("outputs") / f"eval-{time.strftime('%Y%m%d-%H%M%S')}"


def evaluate(cfg: Config) -> EvalReport:
    """Sample ``eval.n`` completions (and, with ``eval.greedy``, one greedy one) of
    every held-out prompt, score them and write ``eval.json`` and ``eval.md``."""
    plan = eval_plan(cfg)
    out = output_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    from rlpost.workers.placement import connect, disconnect

    started = connect(cfg)
    try:
        got = sample_and_score(plan)
    finally:
        if started:
            disconnect()
    e = cfg.eval
    ks = sorted(set(e.k))
    score_name, _ = judged_scores(got.scores)
    prompts = prompt_samples(got.rows, got.sampled, got.scores, plan.reward_fns, got.greedy_scores)
    sampled = got.sampled
    summary: EvalSummary = {
        "model": cfg.model.path,
        "config": _config_summary(cfg),
        "score": score_name,
        "n": e.n,
        "k": ks,
        **summarize(prompts, ks, e.correct_threshold),
        "counts": {
            "prompts": len(got.rows),
            "samples": sum(len(r.completions) for r in sampled),
            "greedy_samples": len(got.greedy),
            "truncated": sum(c.finish_reason == "length" for r in sampled for c in r.completions),
            "reward_errors": int(got.metrics["reward/errors"]),
            "reward_timeouts": int(got.metrics["reward/timeouts"]),
        },
        "wall_s": round(time.perf_counter() - start, 2),
    }
    table = markdown_table(summary)
    (out / "eval.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "eval.md").write_text(table + "\n")
    return EvalReport(out.resolve(), summary, table)


def sample_and_score(plan: RunPlan) -> Scored:
    """Start the replicas, send every prompt, score what comes back, close them
    (Ray already connected)."""
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from rlpost.data.images import row_images
    from rlpost.data.samples import encode_prompt
    from rlpost.rollout.base import GenerationRequest, SamplingConfig
    from rlpost.serving.rollout_group import RolloutGroup
    from rlpost.workers.placement import cpu_threads

    cfg, e, r = plan.cfg, plan.cfg.eval, plan.cfg.rollout
    assert cfg.model.path is not None  # eval_problems
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    plan.fit_prompts(tokenizer)
    rows = plan.val_rows[: e.max_prompts or None]
    sampling = SamplingConfig(
        n=e.n, temperature=e.temperature, top_p=e.top_p, max_tokens=r.max_tokens
    )
    greedy_sampling = SamplingConfig(n=1, temperature=0.0, max_tokens=r.max_tokens)
    rollout = RolloutGroup(
        plan.rollout_engine(cfg.model.path), replicas=r.replicas, num_cpus=r.num_cpus,
        threads=cpu_threads(cfg, plan.device.kind, "rollout"),
        device_opts=plan.device.ray_resource, engine=r.name,
    )  # fmt: skip
    scorer = plan.scorer()
    try:
        chunks = []
        for first in range(0, len(rows), CHUNK):
            requests = []
            for i, row in enumerate(rows[first : first + CHUNK], start=first):
                ids, images = encode_prompt(tokenizer, row), row_images(row)
                # One seed per prompt: reproducible, and no two prompts share a stream.
                seeded = replace(sampling, seed=cfg.trainer.seed * 100_003 + i)
                requests.append(GenerationRequest(ids, seeded, images=images))
                if e.greedy:
                    requests.append(GenerationRequest(ids, greedy_sampling, images=images))
            chunks.append(rollout.generate_async(requests))
        sampled, greedy = [], []
        bar = tqdm(total=len(rows), desc="eval", unit="prompt", dynamic_ncols=True)
        for pending in chunks:
            results = pending.result()
            step = 2 if e.greedy else 1
            sampled += results[::step]
            greedy += results[1::step] if e.greedy else []
            bar.update(len(results) // step)
        bar.close()
        texts = [c.text for res in sampled for c in res.completions]
        flat_rows = [row for row, res in zip(rows, sampled) for _ in res.completions]
        texts += [res.completions[0].text for res in greedy]
        flat_rows += rows[: len(greedy)]
        named, metrics = scorer.score(texts, flat_rows)
    finally:
        scorer.close()
        rollout.close()
    split = len(texts) - len(greedy)
    _, judged = judged_scores(named)
    scores = {k: v[:split] for k, v in named.items()}
    return Scored(rows, sampled, greedy, scores, judged[split:] if e.greedy else None, metrics)


def _config_summary(cfg: Config) -> dict[str, object]:
    """The keys an evaluation's numbers depend on."""
    d = to_dict(cfg)
    data_keys = ("name", "val_files", "val_size", "max_operand", "max_prompt_tokens")
    rollout_keys = ("name", "max_tokens", "max_model_len", "dtype", "replicas")
    return {
        "eval": d["eval"],
        "data": {k: d["data"][k] for k in data_keys},
        "reward": {k: d["reward"][k] for k in ("fn", "weights")},
        "rollout": {k: d["rollout"][k] for k in rollout_keys},
        "seed": cfg.trainer.seed,
    }


def markdown_table(summary: EvalSummary) -> str:
    """greedy, mean@n, pass@k and maj@k for each k: one row overall, one per data source."""
    n, ks = summary["n"], summary["k"]
    greedy = "greedy" in summary["overall"]
    names = (["greedy"] if greedy else []) + ["mean@n"]
    names += [f"pass@{k}" for k in ks] + [f"maj@{k}" for k in ks]
    header = ["source", "prompts", *(f"mean@{n}" if m == "mean@n" else m for m in names)]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    rows = [("overall", summary["overall"]), *summary["per_source"].items()]
    for source, m in rows:
        cells = [source, str(int(m["prompts"])), *(f"{m[name]:.3f}" for name in names)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
