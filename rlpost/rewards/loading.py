"""Reward functions by spec: a built-in name, ``path/to/file.py:function`` or
``package.module:function``, resolved while the config is checked."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from rlpost.data import reasoning_gym
from rlpost.data.tasks import arith, calc, shapes
from rlpost.rewards import verifiers

RewardFn = Callable[..., object]

BUILTIN_REWARDS: dict[str, RewardFn] = {
    # the built-in tasks' own rewards
    "arith": arith.reward,
    "calc": calc.reward,
    "shapes": shapes.reward,
    "reasoning_gym": reasoning_gym.reward,
    # verifiers for common data (rlpost/rewards/verifiers/), each a score under its own name
    "code": verifiers.code_reward,
    "gsm8k": verifiers.gsm8k_reward,
    "gsm8k_flexible": verifiers.gsm8k_flexible_reward,
    "math": verifiers.math_reward,
    "think_format": verifiers.think_format_reward,
}

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


def _load_file(spec: str, path: Path) -> ModuleType:
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
