"""A small typed-schema validator for the composed config.

Each config group is a frozen dataclass whose fields are declared with ``spec``
(``rlpost.algos.spec``: a help text and the checks ``ge``, ``gt``, ``le``, ``lt``,
``choices``). ``validate`` walks a plain dict against a dataclass, collects *every*
problem (unknown keys, wrong types, bad values, a group's rules across its fields)
and raises one ``ConfigError`` naming them all, so a user fixes a config in one go.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union, get_args, get_origin

from rlpost.algos.spec import SettingsError, is_setting, value_problems
from rlpost.algos.spec import spec as spec  # re-exported: the groups declare fields with it

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")


class ConfigError(ValueError):
    """Raised with one line per offending key."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__(
            "invalid config:\n  " + "\n  ".join(problems) + "\n(see docs/configuration.md)"
        )


def settings(cls: type) -> list[dataclasses.Field]:
    """The fields of ``cls`` that are config keys."""
    return [f for f in dataclasses.fields(cls) if is_setting(f)]


def _type_name(tp: object) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if origin in (list, tuple):  # tuple[X, ...] is read from a list
        return f"list of {_type_name(get_args(tp)[0])}"
    if origin is dict:
        k, v = get_args(tp)
        return f"mapping {_type_name(k)} -> {_type_name(v)}"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: object, tp: object, path: str, problems: list[str]) -> object:
    """Return ``value`` converted to ``tp``, or record a problem and return None."""
    origin = get_origin(tp)
    if isinstance(value, str) and value == "???":
        problems.append(f"{path}: required ({_type_name(tp)}), set it with {path}=...")
        return None
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            problems.append(f"{path}: expected a mapping, got {value!r}")
            return None
        return _build(typing.cast(type, tp), value, path, problems)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            trial: list[str] = []
            out = _coerce(value, arg, path, trial)
            if not trial:
                return out
        problems.append(f"{path}={value!r}: expected {_type_name(tp)}")
        return None
    if origin is Literal:
        if value not in get_args(tp):
            problems.append(f"{path}={value!r}: expected {_type_name(tp)}")
        return value
    if origin in (list, tuple):
        if isinstance(value, str) and "," in value:
            items = value.strip("[]")
            problems.append(
                f"{path}={value!r}: a list is written in brackets without spaces, {path}=[{items}]"
            )
            return None
        if isinstance(value, (str, int, float)):
            # One value where a list is taken (``data.train_files=mine.jsonl``) is
            # a list of one.
            value = [value]
        if not isinstance(value, (list, tuple)):
            problems.append(f"{path}={value!r}: expected {_type_name(tp)}")
            return None
        item_tp = get_args(tp)[0]
        out = [_coerce(v, item_tp, f"{path}[{i}]", problems) for i, v in enumerate(value)]
        return tuple(out) if origin is tuple else out
    if origin is dict:
        if not isinstance(value, dict):
            problems.append(f"{path}={value!r}: expected {_type_name(tp)}")
            return None
        _, v_tp = get_args(tp)
        return {str(k): _coerce(v, v_tp, f"{path}.{k}", problems) for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            problems.append(f"{path}={value!r}: expected true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{path}={value!r}: expected an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append(f"{path}={value!r}: expected a number")
            return value
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            problems.append(f"{path}={value!r}: expected a string")
        return value
    if tp is Any:
        return value
    raise TypeError(f"schema type {tp!r} at {path} is not supported")


def _build(cls: type[T], data: dict, path: str, problems: list[str]) -> T | None:
    start = len(problems)
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in settings(cls)}
    for key in data:
        if key not in known:
            problems.append(
                f"{path}.{key}: unknown key; {path} accepts: {', '.join(sorted(known))}"
            )
    kwargs: dict[str, object] = {}
    for name, f in known.items():
        sub = f"{path}.{name}"
        if name not in data:
            has_default = (
                f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            )
            if not has_default:
                choices = f.metadata.get("choices")
                accepts = f", one of {', '.join(map(str, choices))}" if choices else ""
                problems.append(f"{sub}: required ({_type_name(hints[name])}{accepts})")
            continue
        value = _coerce(data[name], hints[name], sub, problems)
        problems.extend(value_problems(value, f.metadata, sub))
        kwargs[name] = value
    if len(problems) > start:
        return None
    try:
        return cls(**kwargs)
    except SettingsError as exc:  # the group's rules across its fields
        problems.extend(exc.at(f"{path}."))
        return None


def validate(cls: type[T], data: dict, path: str) -> tuple[T | None, list[str]]:
    """Build ``cls`` from ``data``; returns the object and the list of problems."""
    problems: list[str] = []
    obj = _build(cls, data, path, problems)
    return obj, problems


def describe(cls: type, path: str) -> list[tuple[str, str, str]]:
    """(key, type, help) rows for documentation and ``--help``."""
    rows = []
    hints = typing.get_type_hints(cls)
    for f in settings(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            rows.extend(describe(tp, f"{path}.{f.name}"))  # type: ignore[arg-type]
        else:
            rows.append((f"{path}.{f.name}", _type_name(tp), f.metadata.get("help", "")))
    return rows


def as_dict(obj: DataclassInstance) -> dict[str, object]:
    """The config keys of ``obj`` (a group) as plain data, what ``validate`` takes
    back: nested groups as mappings, tuples as lists."""
    return {f.name: _plain(getattr(obj, f.name)) for f in settings(type(obj))}


def _plain(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return as_dict(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
