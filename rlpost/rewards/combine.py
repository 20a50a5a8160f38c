"""Several reward functions, one total: ``reward.fn=[fmt.py:fmt, acc.py:acc, math]``.

Each function is named by its spec (``math`` for a built-in, ``fmt`` for
``fmt.py:fmt``) and scored by its own :class:`RewardScorer`, so its calls are
isolated, bounded by ``reward.timeout_s`` and counted on their own
(``reward/<function>/errors``). Its scores enter the total under its name when
it returns a number, under its keys when it returns a dict of named scores;
``reward.weights`` weighs those names (unnamed ones: the function's
``default_weights``, else 1.0). A single function keeps the shape it always had:
a number is the total, a dict's weighted sum is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict

from rlpost.rewards.loading import RewardError, RewardFn
from rlpost.rewards.scoring import RewardScorer, SampleExtras, Scorer

if TYPE_CHECKING:
    from typing import Unpack  # in typing from Python 3.11 (rlpost runs on 3.10 too)

    from rlpost.config.task_groups import RewardConfig


class WorkerSettings(TypedDict):
    """``RewardScorer``'s settings of the processes that call a reward function."""

    num_workers: int
    timeout_s: float
    max_error_frac: float


def reward_specs(fn: str | Sequence[str]) -> list[str]:
    """``reward.fn`` as a list of specs (a single spec is a list of one)."""
    return [fn] if isinstance(fn, str) else list(fn)


def reward_name(spec: str) -> str:
    """The name a spec's scores and metrics go by: a built-in's name, else the
    function's (``path/to/fmt.py:fmt`` and ``pkg.mod:fmt`` are both ``fmt``)."""
    return spec.rpartition(":")[2] if ":" in spec else spec


def check_names(specs: list[str]) -> list[str]:
    """Problems with the functions' names: two specs may not share one."""
    seen: dict[str, str] = {}
    problems = []
    for spec in specs:
        name = reward_name(spec)
        if name in seen:
            problems.append(
                f"reward.fn: {seen[name]!r} and {spec!r} are both named {name!r} (a reward's "
                "scores and metrics go by its function's name); rename one of the functions"
            )
        seen.setdefault(name, spec)
    return problems


def merged_weights(
    specs: list[str], fns: list[RewardFn], weights: dict[str, float]
) -> dict[str, float]:
    """The weights the total uses, as far as they are known before scoring: the
    functions' own ``default_weights`` under ``reward.weights``."""
    out: dict[str, float] = {}
    for fn in fns:
        out.update(getattr(fn, "default_weights", {}))
    return out | dict(weights)


class RewardSet:
    """Score completions with several rewards (see the module docstring): named
    ``members``, each a scorer with ``RewardScorer``'s interface (a reward
    function's, or a reward model's), summed by ``weights`` (those the members
    leave out weigh 1.0)."""

    def __init__(self, members: Sequence[tuple[str, Scorer]], weights: dict[str, float]):
        self.names = [name for name, _ in members]
        self.scorers = [scorer for _, scorer in members]
        self.weights = dict(weights)

    @classmethod
    def of_functions(
        cls,
        specs: list[str],
        fns: list[RewardFn],
        weights: dict[str, float],
        **kw: Unpack[WorkerSettings],
    ) -> RewardSet:
        """Reward functions by spec; ``kw``: ``RewardScorer``'s worker settings."""
        members = [
            (reward_name(spec), RewardScorer(fn, {}, spec=spec, **kw))
            for spec, fn in zip(specs, fns)
        ]  # each sub-total unweighted: the set weighs every name itself
        return cls(members, merged_weights(specs, fns, weights))

    def score(
        self,
        completions: list[str],
        rows: list[dict],
        extras: list[SampleExtras] | None = None,
    ) -> tuple[dict[str, list[float]], dict[str, float]]:
        """``({"total": [...], name: [...], ...}, metrics)`` as ``RewardScorer.score``
        returns them, with every function's errors and timeouts counted under its
        name (``reward/<function>/errors``) and in all (``reward/errors``)."""
        count = len(completions)
        scores: dict[str, list[float]] = {}
        owner: dict[str, str] = {}
        metrics = {"reward/errors": 0.0, "reward/timeouts": 0.0}
        for name, scorer in zip(self.names, self.scorers):
            named, m = scorer.score(completions, rows, extras)
            own = {k: v for k, v in named.items() if k != "total"} or {name: named["total"]}
            for key, values in own.items():
                if key in owner:
                    raise RewardError(
                        f"reward.fn: {owner[key]} and {name} both return a score named {key!r}; "
                        "rename one of them (the total weighs each name once)"
                    )
                owner[key] = name
                scores[key] = values
            for kind in ("errors", "timeouts"):
                metrics[f"reward/{name}/{kind}"] = m[f"reward/{kind}"]
                metrics[f"reward/{kind}"] += m[f"reward/{kind}"]
        unknown = sorted(set(self.weights) - set(owner))
        if unknown:
            raise RewardError(
                f"reward.weights name {unknown}, which no reward returns; the rewards' names "
                f"are {sorted(owner)}: weigh those, e.g. reward.weights.{next(iter(owner))}=1.0"
            )
        total = [sum(self.weights.get(k, 1.0) * scores[k][i] for k in scores) for i in range(count)]
        metrics["reward/mean"] = sum(total) / max(count, 1)
        metrics.update({f"reward/{k}/mean": sum(v) / max(count, 1) for k, v in scores.items()})
        return {"total": total, **scores}, metrics

    def close(self) -> None:
        for scorer in self.scorers:
            scorer.close()


def build_scorer(
    specs: list[str],
    fns: list[RewardFn],
    reward_cfg: RewardConfig,
    extra: Sequence[tuple[str, Scorer]] = (),
) -> RewardScorer | RewardSet:
    """The scorer of ``reward.*``: one function's :class:`RewardScorer`, or a
    :class:`RewardSet` of several and of the ``extra`` named members (a reward
    model's scorer)."""
    kw = WorkerSettings(
        num_workers=reward_cfg.num_workers,
        timeout_s=reward_cfg.timeout_s,
        max_error_frac=reward_cfg.max_error_frac,
    )
    if len(fns) == 1 and not extra:
        return RewardScorer(fns[0], dict(reward_cfg.weights) or None, spec=specs[0], **kw)
    rewards = RewardSet.of_functions(specs, fns, dict(reward_cfg.weights), **kw)
    rewards.names += [name for name, _ in extra]
    rewards.scorers += [scorer for _, scorer in extra]
    return rewards
