"""Reward functions: loaded by spec, called in isolation, scored by name.

A reward function takes the completion text first and the prompt row after it,
in one of two styles, told apart by its signature (``call_plan``):

- **row**: ``fn(completion, row)`` -- the whole row as one dict. Chosen when the
  second parameter is named ``row``, or is not a column of the data;
- **columns**: ``fn(completion, answer=None, **row)`` -- the row's columns as
  keyword arguments (the style of TRL and others). Chosen otherwise; a function
  without ``**kwargs`` receives only the columns it names.

Either style also receives ``messages`` (the whole conversation of a multi-turn
episode) when it names that parameter. It returns a float, or a dict of named
floats (e.g. correctness and format); the ``"total"`` that drives the advantage
is their weighted sum. A call that raises is scored 0 and counted, so one bad
sample never stops a run; a step where most calls fail does
(``reward.max_error_frac``).

Functions written for two other trainers run unchanged, one sample per call
like any other (so isolation and timeouts hold), told apart by a parameter name:

- **trl** (a parameter named ``completions``): TRL's GRPOTrainer style, keyword
  arguments that hold the batch as lists -- ``prompts``, ``completions`` (chat
  messages when the prompt is messages) and the data's other columns -- and a
  list of rewards back. rlpost passes one-element lists and takes the one reward.
- **verl** (a parameter named ``solution_str``): verl's
  ``compute_score(data_source, solution_str, ground_truth, extra_info)``. The
  ground truth is the row's ``reward_model["ground_truth"]`` (verl's data
  layout), else its ``ground_truth`` or ``answer`` column; a dict result
  counts its ``"score"``.
"""

from __future__ import annotations

import inspect
import logging
import math
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from rlpost.rewards.loading import RewardError, RewardFn
from rlpost.rewards.pool import Outcome, RewardPool, SampleExtras

logger = logging.getLogger(__name__)

EXTRAS = ("messages",)  # passed when the function names them, in any style
TRL_MARK, VERL_MARK = "completions", "solution_str"  # the parameters that tell these styles
VERL_ARGS = frozenset({"data_source", "solution_str", "ground_truth", "extra_info"})
GROUND_TRUTH_COLUMNS = ("reward_model", "ground_truth", "answer")


@dataclass(frozen=True)
class CallPlan:
    """How rlpost calls a reward function: ``fn(completion, row)`` or
    ``fn(completion, **columns)``; ``accepts`` is the keyword names it takes
    (None: any, it has ``**kwargs``)."""

    style: Literal["row", "columns", "trl", "verl"]
    accepts: frozenset[str] | None

    def describe(self, name: str) -> str:
        if self.style == "row":
            return f"{name}(completion: str, row: dict)"
        if self.style == "trl":
            return (
                f"{name}(prompts=[prompt], completions=[completion], <column>=[value], ...) "
                "in TRL's style, one sample per call, returning a list of one reward"
            )
        if self.style == "verl":
            return f"{name}(data_source=..., solution_str=completion, ground_truth=..., extra_info=...)"
        names = (
            "**columns"
            if self.accepts is None
            else ", ".join(f"{k}=..." for k in sorted(self.accepts))
        )
        return f"{name}(completion: str, {names}) with the row's columns as keyword arguments"

    def call(self, fn: RewardFn, completion: str, row: dict, extras: SampleExtras) -> object:
        passed = self._accepted(extras)
        if self.style == "trl":
            return _one_reward(fn(**self._accepted(_trl_arguments(completion, row, extras))))
        if self.style == "verl":
            result = fn(**self._accepted(_verl_arguments(completion, row)), **passed)
            return result["score"] if isinstance(result, dict) and "score" in result else result
        if self.style == "row":
            return fn(completion, row, **passed)
        columns = {k: v for k, v in row.items() if k != "completion"}
        if self.accepts is not None:
            columns = {k: v for k, v in columns.items() if k in self.accepts}
        return fn(completion, **columns, **passed)

    def _accepted(self, kwargs: Mapping[str, object]) -> dict[str, object]:
        return {k: v for k, v in kwargs.items() if self.accepts is None or k in self.accepts}


def _trl_arguments(completion: str, row: dict, extras: SampleExtras) -> dict[str, list]:
    """One sample as TRL passes a batch: every argument a list (here of one)."""
    prompt = row.get("prompt")
    chat = isinstance(prompt, list)
    kwargs = {k: [v] for k, v in row.items() if k not in ("prompt", "completion")}
    kwargs.update({k: [v] for k, v in extras.items()})
    kwargs["prompts"] = [prompt]
    kwargs["completions"] = [[{"role": "assistant", "content": completion}] if chat else completion]
    return kwargs


def _one_reward(result: object) -> object:
    if not isinstance(result, list | tuple) or len(result) != 1:
        got = f"{len(result)} values" if isinstance(result, list | tuple) else type(result).__name__
        raise TypeError(
            f"returned {got} for one completion; a TRL-style reward returns a list with one "
            "value per completion"
        )
    return result[0]


def _verl_arguments(completion: str, row: dict) -> dict[str, object]:
    spec = row.get("reward_model")
    if isinstance(spec, dict) and "ground_truth" in spec:
        truth = spec["ground_truth"]
    else:
        truth = row.get("ground_truth", row.get("answer"))
    return {
        "data_source": row.get("data_source"),
        "solution_str": completion,
        "ground_truth": truth,
        "extra_info": row.get("extra_info"),
    }


def _foreign_plan(
    style: Literal["trl", "verl"], params: list[inspect.Parameter], columns: set[str], name: str
) -> CallPlan:
    """The call plan of a function written for TRL or verl (see the module docstring)."""
    trainer = "TRL's GRPOTrainer" if style == "trl" else "verl"
    mark = TRL_MARK if style == "trl" else VERL_MARK
    by_keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if any(p.kind == inspect.Parameter.POSITIONAL_ONLY for p in params):
        raise RewardError(
            f"{name}: written for {trainer} (it takes `{mark}`), which passes every argument "
            "by keyword; drop the positional-only marker (/)"
        )
    given: set[str]
    if style == "trl":
        given = (columns - {"prompt", "completion"}) | {"prompts", "completions", *EXTRAS}
    else:
        given = set(VERL_ARGS) | set(EXTRAS)
        if not columns & set(GROUND_TRUTH_COLUMNS):
            raise RewardError(
                f"{name}: written for verl (it takes `{mark}`) but the data has no ground "
                f"truth: add a 'reward_model' column holding {{'ground_truth': ...}} (verl's "
                f"layout) or a 'ground_truth' or 'answer' column (columns: {sorted(columns)})"
            )
    missing = sorted(
        p.name for p in params
        if p.kind in by_keyword and p.default is p.empty and p.name not in given
    )  # fmt: skip
    if missing:
        raise RewardError(
            f"{name}: written for {trainer} (it takes `{mark}`); rlpost passes "
            f"{sorted(given)} and has nothing for {missing}: give them defaults"
        )
    varkw = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params)
    return CallPlan(style, None if varkw else frozenset(p.name for p in params))


def call_plan(fn: RewardFn, columns: set[str], name: str = "reward") -> CallPlan:
    """Tell the two calling styles apart from ``fn``'s signature and the data's
    ``columns`` (see the module docstring); a signature rlpost cannot call is a
    :class:`RewardError` naming what to change."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: assume the row style
        return CallPlan("row", frozenset())
    names = {p.name for p in params}
    if VERL_MARK in names:
        return _foreign_plan("verl", params, columns, name)
    if TRL_MARK in names:
        return _foreign_plan("trl", params, columns, name)
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    varkw = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params)
    if not params or params[0].kind not in positional + (inspect.Parameter.VAR_POSITIONAL,):
        raise RewardError(
            f"{name}: its first parameter must take the completion text positionally, "
            "e.g. def score(completion, row) or def score(completion, answer=None, **row)"
        )
    rest = [p for p in params[1:] if p.kind != inspect.Parameter.VAR_KEYWORD]
    second = rest[0] if rest else None
    keyword_names = {p.name for p in rest if p.kind != inspect.Parameter.VAR_POSITIONAL}
    if (
        second is not None
        and second.kind in positional
        and (second.name == "row" or (not varkw and second.name not in columns | set(EXTRAS)))
    ):
        required = [
            p.name for p in rest[1:] if p.default is p.empty and p.name not in EXTRAS
            and p.kind != inspect.Parameter.VAR_POSITIONAL
        ]  # fmt: skip
        if required:
            raise RewardError(
                f"{name}: parameters {required} after `{second.name}` (which receives the whole "
                "row) have no default and rlpost has nothing to pass; give them defaults"
            )
        return CallPlan("row", frozenset(keyword_names) if not varkw else None)
    missing = sorted(
        p.name for p in rest
        if p.default is p.empty and p.kind != inspect.Parameter.VAR_POSITIONAL
        and p.name not in columns and p.name not in EXTRAS
    )  # fmt: skip
    if missing:
        raise RewardError(
            f"{name}: parameters {missing} are not columns of the data (columns: "
            f"{sorted(columns)}); give them defaults, name them after columns, or take the "
            "whole row as a second parameter named `row`"
        )
    return CallPlan("columns", None if varkw else frozenset(keyword_names))


def _checked(result: object) -> dict[str, float] | float:
    """A reward's return value as a number or a dict of numbers; else TypeError/ValueError."""
    if isinstance(result, dict):
        if "total" in result:
            raise ValueError("returned a 'total' key; that name is reserved for the sum")
        return {str(k): _as_number(v) for k, v in result.items()}
    return _as_number(result)


def _as_number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"returned a {type(value).__name__}, expected a number")
    if not math.isfinite(value):
        raise ValueError(f"returned {value}, expected a finite number")
    return float(value)


class Scorer(Protocol):
    """What scores completions: a reward function's ``RewardScorer``, a ``RewardSet``
    of several, a reward model's ``ModelReward``, the judge's ``JudgeReward``."""

    weights: dict[str, float]

    def score(
        self,
        completions: list[str],
        rows: list[dict],
        extras: list[SampleExtras] | None = None,
    ) -> tuple[dict[str, list[float]], dict[str, float]]: ...

    def close(self) -> None: ...


class RewardScorer:
    """Score completions with one reward function, isolating its failures.

    ``weights`` combine a dict-valued reward into ``"total"``; a name they
    leave out weighs what the function's own ``default_weights`` attribute says
    (the built-in ``arith`` reward counts only correctness), else 1.0.

    With ``spec`` and ``num_workers > 0`` the calls run in a ``RewardPool`` of
    worker processes, each bounded by ``timeout_s``; otherwise in this process.
    A step in which more than ``max_error_frac`` of the calls fail (raise, time
    out, crash, or return a non-number) raises :class:`RewardError` with the
    first traceback.
    """

    def __init__(
        self,
        fn: RewardFn,
        weights: dict[str, float] | None = None,
        *,
        spec: str | None = None,
        num_workers: int = 0,
        timeout_s: float = 30.0,
        max_error_frac: float = 1.0,
        plan: CallPlan | None = None,
    ):
        self.fn = fn
        self.name = getattr(fn, "__qualname__", repr(fn))
        self.weights = {**getattr(fn, "default_weights", {}), **(weights or {})}
        self.spec, self.num_workers, self.timeout_s = spec, num_workers, timeout_s
        self.max_error_frac = max_error_frac
        self.plan = plan
        self.pool: RewardPool | None = None
        self._warned: set[str] = set()

    def _outcomes(
        self, completions: list[str], rows: list[dict], extras: list[SampleExtras]
    ) -> list[Outcome]:
        if self.plan is None:
            self.plan = call_plan(self.fn, set(rows[0]) if rows else set(), self.name)
        if self.spec is not None and self.num_workers > 0:
            if self.pool is None:
                self.pool = RewardPool(self.spec, self.plan, self.num_workers, self.timeout_s)
            return self.pool.map(completions, rows, extras)
        out = []
        for completion, row, extra in zip(completions, rows, extras):
            try:
                out.append(Outcome("ok", value=self.plan.call(self.fn, completion, row, extra)))
            except Exception:  # isolate user code: counted and scored 0 below
                out.append(Outcome("error", error=traceback.format_exc()))
        return out

    def score(
        self,
        completions: list[str],
        rows: list[dict],
        extras: list[SampleExtras] | None = None,
    ) -> tuple[dict[str, list[float]], dict[str, float]]:
        """Named scores per sample (always with ``"total"``) and metrics.

        ``extras`` (one dict per sample, e.g. ``{"messages": [...]}``) are passed
        to a function that names them. Returns ``({"total": [...], name: [...]},
        {"reward/mean", "reward/errors", "reward/timeouts", "reward/<name>/mean"})``,
        each list of length ``len(completions)``. A sample whose call failed,
        returned a non-number or lacks a name others have scores 0 under every
        name, as does a number among dicts.
        """
        if len(completions) != len(rows):
            raise RewardError(f"{len(completions)} completions but {len(rows)} rows")
        outcomes = self._outcomes(completions, rows, extras or [{} for _ in rows])
        results: list[dict[str, float] | float | None] = []
        failures: list[str] = []
        for o in outcomes:
            if o.status == "ok":
                try:
                    results.append(_checked(o.value))
                    continue
                except (TypeError, ValueError) as e:
                    o.error = f"{type(e).__name__}: {e}"
            failures.append(o.error)
            last = o.error.strip().splitlines()[-1] if o.error.strip() else o.status
            self._warn(f"reward {self.name} {o.status}: {last}")
            results.append(None)
        self._check_failures(failures, len(completions))
        names: list[str] = []
        for r in results:
            if isinstance(r, dict):
                names += [k for k in r if k not in names]
        unknown = sorted(set(self.weights) - set(names))
        if names and unknown:
            raise RewardError(
                f"reward.weights name {unknown} but {self.name} returns {names}; "
                f"weigh the names it returns, e.g. reward.weights.{names[0]}=1.0 (unweighted "
                "names count 1.0)"
            )
        scores: dict[str, list[float]] = {"total": [], **{n: [] for n in names}}
        errors = len(failures)
        for r in results:
            if (isinstance(r, dict) and set(r) != set(names)) or (names and isinstance(r, float)):
                got = sorted(r) if isinstance(r, dict) else "a number"
                self._warn(f"reward {self.name} returned {got}, other samples {names}")
                r = None
                errors += 1
            if r is None:
                for values in scores.values():
                    values.append(0.0)
            elif isinstance(r, dict):
                for n in names:
                    scores[n].append(r[n])
                scores["total"].append(sum(self.weights.get(n, 1.0) * r[n] for n in names))
            else:
                scores["total"].append(r)
        count = max(len(completions), 1)
        metrics = {
            "reward/mean": sum(scores["total"]) / count,
            "reward/errors": float(errors),
            "reward/timeouts": float(sum(o.status == "timeout" for o in outcomes)),
        }
        metrics.update(
            {f"reward/{k}/mean": sum(v) / count for k, v in scores.items() if k != "total"}
        )
        return scores, metrics

    def _check_failures(self, failures: list[str], calls: int) -> None:
        if not calls or len(failures) <= self.max_error_frac * calls:
            return
        assert self.plan is not None
        raise RewardError(
            f"reward.fn {self.name}: {len(failures)} of {calls} calls failed in one step, more "
            f"than reward.max_error_frac={self.max_error_frac:g}. rlpost calls it as "
            f"{self.plan.describe(self.name)}. Fix the function (or raise "
            f"reward.max_error_frac). First failure:\n{failures[0].rstrip()}"
        )

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def _warn(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            logger.warning("%s (scored 0; logged once)", message)
