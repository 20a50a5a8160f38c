"""The YAML presets hold only what they change from the schema's defaults:
a value equal to the default would be a second copy of it (the two drift apart,
as ``data.prompts_per_step`` once did). Deliberate repeats are listed with why."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from rlpost.config.groups import SCHEMAS

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
DELIBERATE = {
    # holds over a rollout preset with a longer one (rollout=sglang), its comment says
    ("agent/calculator.yaml", "rollout.max_model_len"),
    # a reward group file needs some content to exist as a choice (reward=arith)
    ("reward/arith.yaml", "reward.fn"),
}
MISSING = object()


def schema_default(cls: type, keys: list[str]) -> object:
    """The schema's default at ``keys`` under ``cls``; MISSING where there is none
    (a required field, a free-form dict such as ``reward.weights``)."""
    value: object = MISSING
    for key in keys:
        if not dataclasses.is_dataclass(cls):
            return MISSING
        field = {f.name: f for f in dataclasses.fields(cls)}.get(key)
        if field is None:
            return MISSING
        if field.default is not dataclasses.MISSING:
            value = field.default
        elif field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
        else:
            return MISSING
        cls = type(value)
    return value


def leaves(tree: dict, prefix: tuple[str, ...] = ()):
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            yield from leaves(value, (*prefix, key))
        else:
            yield (*prefix, key), value


def repeats() -> list[str]:
    found = []
    for path in sorted(CONFIGS.rglob("*.yaml")):
        text = path.read_text()
        rel = path.relative_to(CONFIGS).as_posix()
        group = None if path.parent == CONFIGS or "@package _global_" in text else path.parent.name
        for keys, value in leaves(yaml.safe_load(text) or {}):
            keys = (group, *keys) if group else keys
            if keys[0] == "defaults" or keys[0] not in SCHEMAS:
                continue
            default = schema_default(SCHEMAS[keys[0]], list(keys[1:]))
            same = default == value or (isinstance(default, tuple) and list(default) == value)
            if default is not MISSING and same and (rel, ".".join(keys)) not in DELIBERATE:
                found.append(f"{rel}: {'.'.join(keys)} = {value!r} is the schema's default")
    return found


def test_presets_repeat_no_schema_default():
    assert repeats() == []


def test_the_check_sees_a_repeat(tmp_path, monkeypatch):
    (tmp_path / "algo").mkdir()
    (tmp_path / "algo" / "mine.yaml").write_text("name: grpo\nkl:\n  loss_coef: 0.0\n")
    monkeypatch.setattr(__import__(__name__), "CONFIGS", tmp_path)
    got = repeats()
    assert any("algo.kl.loss_coef = 0.0" in line for line in got), got
