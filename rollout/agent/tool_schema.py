"""OpenAI-style function schemas from a Python function's type hints and docstring,
and the check of a call's arguments against such a schema.

Supported hints: ``str``, ``int``, ``float``, ``bool``, ``list[X]``, ``dict`` /
``dict[str, X]``, ``Literal[...]``, ``X | None`` / ``Optional[X]`` and unions of
these. A parameter with a default is not required. The description is the
docstring's first paragraph; Google-style ``Args:`` lines describe parameters.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable
from typing import Literal, Union

from rlpost.rollout.agent.json_types import JSONObject

JSON_TYPES: dict[type, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    dict: "object",
}
SECTION = re.compile(
    r"^\s*(Args|Arguments|Parameters|Returns|Return|Raises|Yields|Examples?|Notes?)\s*:\s*$"
)
ARG_LINE = re.compile(r"^\s*(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


class SchemaError(TypeError):
    """A function cannot be described as a tool; the message says what to change."""


def tool_schema(fn: Callable[..., object]) -> JSONObject:
    """``{"type": "function", "function": {"name", "description", "parameters"}}`` for ``fn``.

    Raises ``SchemaError`` for a missing docstring, a parameter without a type
    hint, ``*args`` / ``**kwargs`` or a hint with no JSON-schema equivalent.
    """
    name = getattr(fn, "__name__", type(fn).__name__)
    doc = inspect.getdoc(fn)
    if not doc or not doc.strip():
        raise SchemaError(
            f"{name} has no docstring; add one whose first paragraph says what the tool does"
        )
    description, arg_docs = parse_docstring(doc)
    try:
        hints = typing.get_type_hints(fn)
    except Exception as e:  # unresolvable forward references and the like
        raise SchemaError(f"{name}: cannot resolve its type hints ({e})") from e
    properties: dict[str, JSONObject] = {}
    required: list[str] = []
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise SchemaError(f"{name}: *{param.name} is not allowed; list each parameter")
        if param.name not in hints:
            raise SchemaError(
                f"{name}: parameter {param.name!r} has no type hint; annotate it "
                "(str, int, float, bool, list[...], dict, Literal[...] or X | None)"
            )
        try:
            prop = json_schema(hints[param.name])
        except SchemaError as e:
            raise SchemaError(f"{name}: parameter {param.name!r}: {e}") from None
        if param.name in arg_docs:
            prop["description"] = arg_docs[param.name]
        properties[param.name] = prop
        if param.default is param.empty:
            required.append(param.name)
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def json_schema(hint: object) -> JSONObject:
    """The JSON schema of one type hint (``{"type": ...}`` plus ``items``/``enum``/``nullable``)."""
    if isinstance(hint, type) and hint in JSON_TYPES:
        return {"type": JSON_TYPES[hint]}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        kinds = {JSON_TYPES.get(type(a)) for a in args}
        if None in kinds or len(kinds) != 1:
            raise SchemaError(f"Literal{list(args)} must hold values of one type (str, int, ...)")
        return {"type": kinds.pop(), "enum": list(args)}
    if origin in (Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        schemas = [json_schema(a) for a in members]
        if len(schemas) == 1:
            out = schemas[0]
        elif all(set(s) == {"type"} for s in schemas):
            out = {"type": [s["type"] for s in schemas]}
        else:
            out = {"anyOf": schemas}
        if len(members) < len(args):
            out["nullable"] = True
        return out
    if origin is list:
        return {"type": "array", "items": json_schema(args[0])} if args else {"type": "array"}
    if origin is dict:
        if args and args[0] is not str:
            raise SchemaError(f"{hint} has non-string keys; JSON objects have string keys")
        out = {"type": "object"}
        if args:
            out["additionalProperties"] = json_schema(args[1])
        return out
    raise SchemaError(f"type {hint!r} has no JSON-schema equivalent")


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """First paragraph (lines joined) and ``{parameter: description}`` from ``Args:``."""
    lines = doc.strip().splitlines()
    first: list[str] = []
    for line in lines:
        if not line.strip() or SECTION.match(line):
            break
        first.append(line.strip())
    arg_docs: dict[str, str] = {}
    in_args, current, indent = False, None, 0
    for line in lines:
        header = SECTION.match(line)
        if header:
            in_args, current = header.group(1) in ("Args", "Arguments", "Parameters"), None
            continue
        if not in_args or not line.strip():
            continue
        line_indent = len(line) - len(line.lstrip())
        match = ARG_LINE.match(line)
        if match and (current is None or line_indent <= indent):
            current, indent = match.group(1).lstrip("*"), line_indent
            arg_docs[current] = match.group(2).strip()
        elif current is not None and line_indent > indent:
            arg_docs[current] = f"{arg_docs[current]} {line.strip()}".strip()
        else:
            in_args = False
    return " ".join(first), arg_docs


def check_arguments(schema: JSONObject, arguments: dict[str, object]) -> list[str]:
    """Every problem with ``arguments`` against a ``tool_schema`` result: missing required,
    unexpected and wrongly typed arguments. Empty when the call may go ahead."""
    params = schema["function"]["parameters"]
    properties = params["properties"]
    problems = [
        f"missing required argument {k!r}" for k in params["required"] if k not in arguments
    ]
    problems += [
        f"unexpected argument {k!r} (accepted: {sorted(properties)})"
        for k in arguments
        if k not in properties
    ]
    for key, value in arguments.items():
        if key in properties:
            problem = _check_value(properties[key], value)
            if problem:
                problems.append(f"argument {key!r} {problem}")
    return problems


def _check_value(schema: JSONObject, value: object) -> str | None:
    if value is None:
        return None if schema.get("nullable") else "must not be null"
    if "anyOf" in schema:
        if any(_check_value(s, value) is None for s in schema["anyOf"]):
            return None
        return f"matches none of the accepted types, got {value!r}"
    kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    if not any(_is_kind(value, k) for k in kinds):
        return f"must be {' or '.join(kinds)}, got {_json_kind(value)} {value!r}"
    if "enum" in schema and value not in schema["enum"]:
        return f"must be one of {schema['enum']}, got {value!r}"
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            problem = _check_value(schema["items"], item)
            if problem:
                return f"item {i} {problem}"
    if isinstance(value, dict) and "additionalProperties" in schema:
        for k, item in value.items():
            problem = _check_value(schema["additionalProperties"], item)
            if problem:
                return f"key {k!r} {problem}"
    return None


def _is_kind(value: object, kind: str) -> bool:
    if isinstance(value, bool):
        return kind == "boolean"
    if kind == "number":
        return isinstance(value, int | float)
    if kind == "integer":
        return isinstance(value, int)
    return {"string": str, "boolean": bool, "array": list, "object": dict}.get(kind) is type(value)


def _json_kind(value: object) -> str:
    for py, kind in JSON_TYPES.items():
        if type(value) is py:
            return kind
    return type(value).__name__
