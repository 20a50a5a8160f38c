"""A setting, declared once: a dataclass field with its help text and value checks.

The algorithm's configs (``rlpost.algos.config``), the engines' and the run config's
groups (``rlpost.config``) declare their fields with ``spec``. ``check`` tests an
object against that metadata (bounds, choices) and against its class's rules across
fields; the run config's validator (``rlpost.config.schema``) reads the same metadata
and the same rules, naming each key in full (``algo.policy_loss.clip_low``).
Standard library only.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, overload

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")

# A class's rules across its fields: given the prefix of the keys they name ("" in
# Python, "algo.off_policy." in the run config), the problems found.
Rules = Callable[[str], list[str]]

CHECKS = ("ge", "gt", "le", "lt", "choices")
_BOUNDS = (("ge", operator.ge, ">="), ("gt", operator.gt, ">"), ("le", operator.le, "<="),
           ("lt", operator.lt, "<"))  # fmt: skip


@overload
def spec(default: T, *, help: str = "", setting: bool = True, **checks: object) -> T: ...


@overload  # no default: the field's declared type, as ``dataclasses.field()`` gives it
def spec(*, help: str = "", setting: bool = True, **checks: object) -> Any: ...


def spec(
    default: object = dataclasses.MISSING, *, help: str = "", setting: bool = True, **checks: object
) -> object:
    """A dataclass field with a help text and value checks (``ge``, ``gt``, ``le``, ``lt``,
    ``choices``). ``setting=False``: checked the same way, but not a config key; the
    code fills it (the advantage's reward weights come from the reward group)."""
    unknown = sorted(set(checks) - set(CHECKS))
    if unknown:
        raise TypeError(f"spec() got unknown checks {unknown}; it takes {', '.join(CHECKS)}")
    meta = {"help": help, "setting": setting, **checks}
    if isinstance(default, (list, dict)):
        value = default
        return dataclasses.field(default_factory=lambda: type(value)(value), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def is_setting(f: dataclasses.Field) -> bool:
    """Whether ``f`` is a config key: every field but those declared ``setting=False``."""
    return bool(f.metadata.get("setting", True))


def value_problems(value: object, meta: Mapping[str, Any], key: str) -> list[str]:
    """``key=value`` against a field's checks; a value that is None, a bool or not a
    scalar has none to fail (its type is the validator's to check)."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return []
    problems = []
    if "choices" in meta and value not in meta["choices"]:
        problems.append(f"{key}={value!r}: expected one of {', '.join(map(str, meta['choices']))}")
    if isinstance(value, str):
        return problems
    for name, holds, sign in _BOUNDS:
        if name in meta and not holds(value, meta[name]):
            problems.append(f"{key}={value!r}: must be {sign} {meta[name]}")
    return problems


def problems(settings: DataclassInstance, at: str = "", rules: Rules | None = None) -> list[str]:
    """Every field of ``settings`` against its checks, then ``rules``; each key named
    with the prefix ``at``."""
    found = [
        problem
        for f in dataclasses.fields(settings)
        for problem in value_problems(getattr(settings, f.name), f.metadata, at + f.name)
    ]
    return found + (rules(at) if rules is not None else [])


class SettingsError(ValueError):
    """A settings object that breaks its checks; ``at(prefix)`` lists the problems again
    with every key prefixed (``at("algo.policy_loss.")``), as the run config names them."""

    def __init__(self, settings: DataclassInstance, at: Callable[[str], list[str]]):
        self.at = at
        super().__init__(f"invalid {type(settings).__name__}: " + "; ".join(at("")))


def check(settings: DataclassInstance, rules: Rules | None = None) -> None:
    """Raise ``SettingsError`` naming every field of ``settings`` that breaks its checks
    and every broken rule, all at once; a settings class calls it in ``__post_init__``."""

    def at(prefix: str) -> list[str]:
        return problems(settings, prefix, rules)

    if at(""):
        raise SettingsError(settings, at)


def narrow(settings: DataclassInstance, cls: type[T]) -> T:
    """``settings`` as ``cls``, a class it derives from: the fields ``cls`` declares,
    copied (a run-config group that adds keys to an engine's settings hands the
    engine exactly its own)."""
    return cls(**{f.name: getattr(settings, f.name) for f in dataclasses.fields(cls)})  # type: ignore[arg-type]
