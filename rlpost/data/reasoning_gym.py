"""reasoning-gym's procedural datasets as rlpost rows, scored by their own verifiers.

``data=reasoning_gym data.reasoning_gym.datasets=[chain_sum, countdown]`` trains
on rows that ``reasoning_gym.create_dataset(name, size=..., seed=..., **config)``
generates (nothing is downloaded); ``reward.fn=reasoning_gym`` (which
``data=reasoning_gym`` selects) scores a completion with that dataset's own
``score_answer``. A row is

    {"prompt": [system?, user: question], "answer": ..., "data_source": "reasoning_gym/<name>",
     "rg_dataset": name, "rg_entry": the generator's entry (question, answer, metadata),
     "rg_config": the generator's keyword arguments}

Training rows are split between the datasets by ``weights`` (equal by default),
held-out rows likewise; each dataset's held-out rows come from the same
generator after its training rows, and any whose question is also a training
question is dropped, so the two never overlap.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

from rlpost.data.rows import DataError

if TYPE_CHECKING:
    from rlpost.config.task_groups import ReasoningGymConfig

EXTRA = "pip install 'rlpost[reasoning-gym]'"


def _rg() -> ModuleType:
    try:
        import reasoning_gym
    except ImportError as exc:
        raise DataError(
            f"data.name=reasoning_gym needs the reasoning-gym package ({exc}); {EXTRA}"
        ) from None
    return reasoning_gym


def split_counts(total: int, names: list[str], weights: dict[str, float]) -> dict[str, int]:
    """``total`` rows shared by ``weights`` (1.0 for a name without one): largest
    remainders, so the counts sum to ``total``."""
    w = {n: float(weights.get(n, 1.0)) for n in names}
    scale = sum(w.values())
    exact = {n: total * w[n] / scale for n in names}
    counts = {n: int(exact[n]) for n in names}
    for n in sorted(names, key=lambda n: exact[n] - counts[n], reverse=True)[
        : total - sum(counts.values())
    ]:
        counts[n] += 1
    return counts


def check_config(rg_cfg: ReasoningGymConfig) -> list[str]:
    """What is wrong with ``data.reasoning_gym``, all at once (the package is needed)."""
    try:
        rg = _rg()
    except DataError as exc:
        return [str(exc)]
    known = sorted(rg.factory.DATASETS)
    problems = []
    if not rg_cfg.datasets:
        problems.append(
            "data.reasoning_gym.datasets is empty: name at least one of reasoning-gym's "
            f"{len(known)} datasets, e.g. data.reasoning_gym.datasets=[chain_sum]"
        )
    for name in rg_cfg.datasets:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3)
            hint = (
                f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(known)}"
            )
            problems.append(
                f"data.reasoning_gym.datasets: {name!r} is not a reasoning-gym dataset{hint}"
            )
    for key in ("weights", "config"):
        extra = sorted(set(getattr(rg_cfg, key)) - set(rg_cfg.datasets))
        if extra:
            problems.append(
                f"data.reasoning_gym.{key} names {extra}, which data.reasoning_gym.datasets does "
                "not list; add them there or drop them"
            )
    bad = {n: w for n, w in rg_cfg.weights.items() if not float(w) > 0}
    if bad:
        problems.append(f"data.reasoning_gym.weights={bad}: weights must be > 0")
    if rg_cfg.system_prompt is not None and rg_cfg.system_prompt not in rg.utils.SYSTEM_PROMPTS:
        problems.append(
            f"data.reasoning_gym.system_prompt={rg_cfg.system_prompt!r}: not one of "
            f"reasoning-gym's {sorted(rg.utils.SYSTEM_PROMPTS)}; null for none"
        )
    return problems


def reasoning_gym_rows(
    rg_cfg: ReasoningGymConfig, num_val: int, seed: int
) -> tuple[list[dict], list[dict]]:
    """Training and held-out rows for ``data.reasoning_gym``; raises ``DataError``."""
    problems = check_config(rg_cfg)
    if problems:
        raise DataError("\n  ".join(problems))
    rg = _rg()
    names = list(rg_cfg.datasets)
    train_n = split_counts(rg_cfg.size, names, dict(rg_cfg.weights))
    val_n = split_counts(num_val, names, dict(rg_cfg.weights))
    system = rg.utils.SYSTEM_PROMPTS[rg_cfg.system_prompt] if rg_cfg.system_prompt else None
    base = seed if rg_cfg.seed is None else rg_cfg.seed
    train: list[dict] = []
    val: list[dict] = []
    for k, name in enumerate(names):
        kwargs = dict(rg_cfg.config.get(name) or {})
        # a few more than needed, for the held-out questions a training one repeats
        size = train_n[name] + 2 * val_n[name] + 8
        try:
            entries = list(rg.create_dataset(name, size=size, seed=base + 1009 * k, **kwargs))
        except Exception as exc:  # the generator's config check: name the key to change
            raise DataError(
                f"data.reasoning_gym: create_dataset({name!r}, {kwargs}) raised "
                f"{type(exc).__name__}: {exc}; fix data.reasoning_gym.config.{name}"
            ) from exc
        rows = [_row(name, e, system, kwargs) for e in entries]
        seen = {r["rg_entry"]["question"] for r in rows[: train_n[name]]}
        held = [r for r in rows[train_n[name] :] if r["rg_entry"]["question"] not in seen]
        if len(held) < val_n[name]:
            raise DataError(
                f"data.reasoning_gym: {name} repeats its questions too often to hold out "
                f"{val_n[name]} unseen ones; lower data.val_size or data.reasoning_gym.size"
            )
        train += rows[: train_n[name]]
        val += held[: val_n[name]]
    return train, val


def _row(name: str, entry: dict, system: str | None, config: dict) -> dict:
    entry = json.loads(json.dumps(entry, default=list))  # tuples -> lists: rows are JSON
    prompt = [{"role": "user", "content": entry["question"]}]
    if system:
        prompt.insert(0, {"role": "system", "content": system})
    return {
        "prompt": prompt,
        "answer": str(entry["answer"]),
        "data_source": f"reasoning_gym/{name}",
        "rg_dataset": name,
        "rg_entry": entry,
        "rg_config": config,
    }


_SCORERS: dict[str, Callable[[str, dict], float]] = {}


def reward(completion: str, row: dict) -> dict[str, float]:
    """reasoning-gym's own verdict, as the named reward ``correctness`` (so held-out
    runs report it as ``val/accuracy``, the mean score): the dataset's
    ``score_answer`` on the completion's ``<answer>...</answer>`` (the whole
    completion, stripped, when it has no such tag)."""
    rg = _rg()
    name, config = row["rg_dataset"], row.get("rg_config") or {}
    key = f"{name}/{json.dumps(config, sort_keys=True)}"
    if key not in _SCORERS:  # the generator as configured: some scorers read its config
        _SCORERS[key] = rg.create_dataset(name, size=1, seed=0, **config).score_answer
    answer = rg.utils.extract_answer(completion) if "<answer>" in completion else completion.strip()
    return {"correctness": float(_SCORERS[key](answer, row["rg_entry"]))}
