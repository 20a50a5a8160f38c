"""Reward functions: loaded by spec, called in isolation, scored by name.

A reward function is ``fn(completion: str, row: dict) -> float | dict[str,
float]``. A dict gives several named rewards (e.g. correctness and format);
the ``"total"`` that drives the advantage is their weighted sum. A call that
raises is scored 0 and counted, so one bad sample never stops a run.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlpost.tasks import arith

logger = logging.getLogger(__name__)

RewardFn = Callable[[str, dict], Any]

BUILTIN_REWARDS: dict[str, RewardFn] = {"arith": arith.reward}

SPEC_FORMS = (
    f"a built-in name ({', '.join(sorted(BUILTIN_REWARDS))}), "
    "'path/to/file.py:function' or 'package.module:function'"
)


class RewardError(ValueError):
    """A reward function cannot be loaded or used; the message says what to change."""


def load_reward_fn(spec: str) -> RewardFn:
    """Resolve ``spec`` to a callable; every failure is a :class:`RewardError`.

    Called while the config is checked, so a typo fails before any model loads.
    """
    if spec in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[spec]
    if ":" not in spec:
        raise RewardError(f"reward {spec!r} is not a built-in reward; use {SPEC_FORMS}")
    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise RewardError(f"reward {spec!r} is malformed; use {SPEC_FORMS}")
    if target.endswith(".py") or "/" in target:
        module = _load_file(spec, Path(target))
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise RewardError(
                f"reward {spec!r}: cannot import module {target!r} ({e}); "
                "check the module is installed or on PYTHONPATH, or give a path to a .py file"
            ) from e
    if not hasattr(module, name):
        public = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise RewardError(
            f"reward {spec!r}: {target!r} has no attribute {name!r}; its functions: {public}"
        )
    fn = getattr(module, name)
    if not callable(fn):
        raise RewardError(
            f"reward {spec!r}: {name!r} has type {type(fn).__name__}, not callable; "
            "point the spec at a function fn(completion, row)"
        )
    return fn


def _load_file(spec: str, path: Path) -> Any:
    if not path.is_file():
        raise RewardError(f"reward {spec!r}: file {str(path)!r} does not exist; fix the path")
    module_name = f"rlpost_user_reward_{path.stem}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[module_name]
        raise RewardError(
            f"reward {spec!r}: importing {str(path)!r} raised {type(e).__name__}: {e}"
        ) from e
    return module


def _as_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"returned a {type(value).__name__}, expected a number")
    if not math.isfinite(value):
        raise ValueError(f"returned {value}, expected a finite number")
    return float(value)


class RewardScorer:
    """Score completions with one reward function, isolating its failures.

    ``weights`` combine a dict-valued reward into ``"total"``; unnamed keys
    weigh 1.0. Without ``weights`` the function's own ``default_weights``
    attribute is used when it has one (the built-in ``arith`` reward counts
    only correctness).
    """

    def __init__(self, fn: RewardFn, weights: dict[str, float] | None = None):
        self.fn = fn
        self.name = getattr(fn, "__qualname__", repr(fn))
        self.weights = dict(weights if weights is not None else getattr(fn, "default_weights", {}))
        self._warned: set[str] = set()

    def _call(self, completion: str, row: dict) -> dict[str, float] | float:
        result = self.fn(completion, row)
        if isinstance(result, dict):
            if "total" in result:
                raise ValueError("returned a 'total' key; that name is reserved for the sum")
            return {str(k): _as_number(v) for k, v in result.items()}
        return _as_number(result)

    def score(
        self, completions: list[str], rows: list[dict]
    ) -> tuple[dict[str, list[float]], dict[str, float]]:
        """Named scores per sample (always with ``"total"``) and metrics.

        Returns ``({"total": [...], name: [...]}, {"reward/mean", "reward/errors",
        "reward/<name>"})``, each list of length ``len(completions)``. A sample
        whose call raised, returned a non-number or lacks a name others have
        scores 0 under every name, as does a number among dicts.
        """
        if len(completions) != len(rows):
            raise RewardError(f"{len(completions)} completions but {len(rows)} rows")
        results: list[dict[str, float] | float | None] = []
        for completion, row in zip(completions, rows):
            try:
                results.append(self._call(completion, row))
            except Exception as e:  # isolate user code: count, log once, score 0
                self._warn(f"reward {self.name} {type(e).__name__}: {e}")
                results.append(None)
        names: list[str] = []
        for r in results:
            if isinstance(r, dict):
                names += [k for k in r if k not in names]
        unknown = sorted(set(self.weights) - set(names))
        if names and unknown:
            raise RewardError(
                f"reward weights name {unknown} but {self.name} returns {names}; "
                "fix the weights in the reward config"
            )
        scores: dict[str, list[float]] = {"total": [], **{n: [] for n in names}}
        errors = 0
        for r in results:
            if (isinstance(r, dict) and set(r) != set(names)) or (names and isinstance(r, float)):
                got = sorted(r) if isinstance(r, dict) else "a number"
                self._warn(f"reward {self.name} returned {got}, other samples {names}")
                r = None
            if r is None:
                errors += 1
                for values in scores.values():
                    values.append(0.0)
            elif isinstance(r, dict):
                for n in names:
                    scores[n].append(r[n])
                scores["total"].append(sum(self.weights.get(n, 1.0) * r[n] for n in names))
            else:
                scores["total"].append(r)
        count = max(len(completions), 1)
        metrics = {"reward/mean": sum(scores["total"]) / count, "reward/errors": float(errors)}
        metrics.update({f"reward/{k}": sum(v) / count for k, v in scores.items() if k != "total"})
        return scores, metrics

    def _warn(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            logger.warning("%s (scored 0; logged once)", message)
