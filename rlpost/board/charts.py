"""Which curves a run page draws: metrics grouped into charts by name, and the
x axis (step, or wall time from cumulative ``timing/step_s``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from rlpost.loop.tracking import HEADLINES

if TYPE_CHECKING:
    from rlpost.board.runs import MetricsRow

# (title, what the chart shows, which keys belong in it); the first chart that
# takes a key gets it, so order matters.
CHARTS: list[tuple[str, str, Callable[[str], bool]]] = [
    (
        "Reward",
        "reward/mean and each named reward (reward/<name>/mean)",
        lambda k: k == "reward/mean" or bool(re.fullmatch(r"reward/[^/]+/mean", k)),
    ),
    (
        "Held-out",
        "the run's held-out headline (accuracy, reward, pair accuracy, NLL) and val/pass@k",
        lambda k: k in {h.val for h in HEADLINES} or k.startswith("val/pass@"),
    ),
    (
        "Pairs",
        "preference pairs won and their margins (DPO's implicit rewards, a reward model's)",
        lambda k: (
            k.removeprefix("val/").startswith(("rewards/", "rm/accuracy", "rm/margin"))
            or k == "val/reward_margin"
        ),
    ),
    (
        "Loss",
        "the training objective: DPO, reward model, SFT NLL, the policy loss",
        lambda k: k.endswith(("/loss", "/nll")),
    ),
    (
        "KL",
        "KL to the old, reference and behaviour policy",
        lambda k: k.rpartition("/")[2].startswith("kl") or k.endswith("_kl"),
    ),
    ("Entropy", "policy entropy", lambda k: "entropy" in k.rpartition("/")[2]),
    ("Clip fraction", "tokens whose ratio was clipped", lambda k: "clipfrac" in k),
    (
        "Log-prob gap",
        "rollout engine vs trainer log-probs",
        lambda k: k.startswith("rollout/logprob_abs_diff"),
    ),
    (
        "Step time (s)",
        "generate, log-probs, update, weight sync and the whole step",
        lambda k: (
            k
            in (
                "timing/generate_s",
                "timing/logprob_s",
                "timing/update_s",
                "timing/weight_sync_s",
                "timing/step_s",
            )
        ),
    ),
    ("Tokens/s", "throughput", lambda k: k.startswith("perf/") and k.endswith("tokens_per_s")),
    ("Async staleness", "policy versions behind", lambda k: k.startswith("async/staleness")),
]


def numeric_keys(rows: Iterable[Mapping[str, object]]) -> list[str]:
    keys: dict[str, None] = {}
    for row in rows:
        for k, v in row.items():
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                keys[k] = None
    return sorted(keys)


def group_metrics(keys: Iterable[str]) -> list[tuple[str, str, list[str]]]:
    """(title, description, keys) for every chart with at least one key present.
    Async staleness is drawn only when some run was actually stale (``keys`` is
    the union over the runs compared)."""
    keys = list(keys)
    taken: set[str] = set()
    out = []
    for title, text, takes in CHARTS:
        mine = [k for k in keys if k not in taken and takes(k)]
        taken.update(mine)
        if mine:
            out.append((title, text, mine))
    return out


def x_values(rows: list[MetricsRow], axis: str) -> list[float]:
    """Each row's x: its step, or (``axis="time"``) seconds since the run began,
    the sum of ``timing/step_s`` up to and including that row (the metrics carry
    no timestamps). Rows without ``timing/step_s`` (validation at step 0) add 0."""
    if axis == "step":
        return [float(r["step"]) for r in rows]
    out, total = [], 0.0
    for r in rows:
        value = r.get("timing/step_s")
        total += float(value) if isinstance(value, (int, float)) else 0.0
        out.append(total)
    return out


def chart_data(runs: list[tuple[str, list[MetricsRow]]], axis: str = "step") -> dict[str, object]:
    """The JSON the run page draws: for each chart, one series per (run, key)
    with its ``[x, y, step]`` points (only rows that logged the key)."""
    keys = numeric_keys(row for _, rows in runs for row in rows)
    stale = any(r.get("async/staleness_max", 0) not in (0, 0.0) for _, rows in runs for r in rows)
    charts = []
    for title, text, mine in group_metrics(keys):
        if title == "Async staleness" and not stale:
            continue
        series = []
        for name, rows in runs:
            xs = x_values(rows, axis)
            for key in mine:
                points = [
                    [x, float(r[key]), r["step"]]
                    for x, r in zip(xs, rows)
                    if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)
                ]
                if points:
                    series.append({"run": name, "key": key, "points": points})
        charts.append({"title": title, "text": text, "series": series})
    return {"axis": axis, "charts": charts, "keys": keys}
