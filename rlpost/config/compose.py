"""Config schema (one dataclass per Hydra group) and composition.

Hydra composes ``config.yaml`` with the group choices named on the command
line; ``key=value`` overrides are merged afterwards without struct checks, so
that *every* unknown or bad key is reported at once by the schema validator
instead of Hydra stopping at the first one.

Hydra looks for ``config.yaml`` and each ``group/option.yaml`` along a search
path, the first folder that has it winning: the user's folders
(``--config-dir``, then ``$RLPOST_CONFIG_DIR``), then the presets rlpost ships
(``config_dir()``). A user's folder adds presets or replaces one of the same name.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rlpost.config.checks import cross_checks
from rlpost.config.groups import FIELDS, GROUPS, OPTIONAL_GROUPS, SCHEMAS, Config
from rlpost.config.schema import ConfigError, as_dict, validate

# rollout.block_size under rollout.pd.enabled (vLLM) when not given: the CPU
# backend's smallest block (a GPU takes 16 too).
PD_BLOCK_SIZE = 32


CONFIG_DIR_OPTION = "--config-dir"
CONFIG_DIR_ENV = "RLPOST_CONFIG_DIR"
# the CLI's own flags (``rlpost.main``)
OPTIONS = ("--help", "--help-keys", CONFIG_DIR_OPTION)


def config_dir() -> Path:
    """The presets rlpost ships: ``rlpost/configs/`` of an installed rlpost (setup.py
    installs the checkout's top-level ``configs/`` there), else ``configs/`` of the
    checkout this package sits in (an editable install)."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "configs"
    return installed if installed.is_dir() else package.parent / "configs"


def split_config_dirs(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``--config-dir PATH`` and ``--config-dir=PATH`` (any number, in order) out of
    ``argv``: returns (the paths, the other arguments)."""
    dirs: list[str] = []
    rest: list[str] = []
    items = iter(argv)
    for item in items:
        if item == CONFIG_DIR_OPTION:
            path = next(items, None)
            if path is None or path.startswith("-") or "=" in path:
                raise ConfigError(
                    [f"{CONFIG_DIR_OPTION} needs a folder: {CONFIG_DIR_OPTION} my_configs"]
                )
            dirs.append(path)
        elif item.startswith(f"{CONFIG_DIR_OPTION}="):
            dirs.append(item.partition("=")[2])
        else:
            rest.append(item)
    return dirs, rest


def search_path(user_dirs: Sequence[str | Path] = ()) -> list[Path]:
    """Where the config is looked for, first match winning: ``user_dirs`` (the
    ``--config-dir`` folders), the folders in ``$RLPOST_CONFIG_DIR`` (separated by
    ``os.pathsep``), then ``config_dir()``. A user folder that does not exist or
    holds no YAML raises ConfigError (all of them at once)."""
    named = [(Path(d).expanduser(), f"{CONFIG_DIR_OPTION} {d}") for d in user_dirs]
    env = os.environ.get(CONFIG_DIR_ENV, "")
    named += [(Path(d).expanduser(), f"{CONFIG_DIR_ENV}={d}") for d in env.split(os.pathsep) if d]
    problems = []
    for folder, source in named:
        if not folder.is_dir():
            problems.append(
                f"{source}: no such folder; give a folder of your presets, e.g. "
                "my_configs/algo/my_algo.yaml, and choose it with algo=my_algo"
            )
        elif not any(folder.glob("*.yaml")) and not any(folder.glob("*/*.yaml")):
            problems.append(
                f"{source}: holds no YAML; put presets in group folders "
                f"({', '.join(GROUPS)}), e.g. {folder}/algo/my_algo.yaml"
            )
    if problems:
        raise ConfigError(problems)
    return list(dict.fromkeys([*(folder.resolve() for folder, _ in named), config_dir()]))


def presets(group: str, path: Sequence[Path]) -> list[str]:
    """The options of ``group`` along ``path``, a user's and the shipped ones together."""
    return sorted({p.stem for folder in path for p in (folder / group).glob("*.yaml")})


@contextmanager
def _hydra_search(path: Sequence[Path]) -> Iterator[None]:
    """Hydra initialised with ``path`` as its config search path, in this order.

    ``hydra.searchpath`` would append folders *after* the primary one, and Hydra
    looks for ``config.yaml`` in the primary folder alone before it reads it; so
    the search path is built here as ``initialize_config_dir`` builds its own, with
    every folder in it from the start.
    """
    from hydra import initialize_config_dir
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra

    with initialize_config_dir(config_dir=str(path[0]), version_base="1.3"):
        search = create_config_search_path(str(path[0]))
        for folder in path[1:]:  # before the structured configs, in order
            search.prepend("rlpost", f"file://{folder}", anchor=SearchPathQuery(provider="schema"))
        GlobalHydra.instance().clear()
        Hydra.create_main_hydra2(task_name="app", config_search_path=search)
        yield


def from_dict(raw: Mapping[str, object]) -> Config:
    """Validate a plain nested dict; raises ConfigError listing every problem."""
    problems: list[str] = []
    for key in raw:
        if key not in SCHEMAS:
            problems.append(f"{key}: unknown config group; groups are {', '.join(SCHEMAS)}")
    groups: dict[str, Any] = {}  # Config's keyword arguments: each group's object
    for name, schema in SCHEMAS.items():
        data = raw.get(name, {} if name in OPTIONAL_GROUPS else None)
        if data is None:
            problems.append(f"{name}: missing config group")
            continue
        if not isinstance(data, dict):
            problems.append(f"{name}={data!r}: expected a mapping")
            continue
        obj, errs = validate(schema, data, name)
        problems.extend(errs)
        groups[FIELDS.get(name, name)] = obj
    if problems:
        raise ConfigError(problems)
    cfg = _with_ranks(Config(**groups))
    problems = cross_checks(cfg)
    if problems:
        raise ConfigError(problems)
    return _derive(cfg)


def _with_ranks(cfg: Config) -> Config:
    """``trainer.world_size`` when not given (0): one FSDP2 rank, or Megatron's
    layout tp x pp x cp times its data-parallel size (``trainer.megatron.dp``, 1
    when not given either). A given world size stays as it is; the cross-checks
    say when it does not fit the layout."""
    import dataclasses

    t, mg = cfg.trainer, cfg.trainer.megatron
    if t.world_size:
        return cfg
    ranks = mg.tp * mg.pp * mg.cp * max(mg.dp, 1) if t.name == "megatron" else 1
    return dataclasses.replace(cfg, trainer=dataclasses.replace(t, world_size=ranks))


def _derive(cfg: Config) -> Config:
    """Values computed from others, in this one place."""
    import dataclasses

    pd = cfg.rollout.pd
    if pd.enabled:
        # Placement reserves, and the rollout group starts, prefill + decode replicas.
        rollout = dataclasses.replace(
            cfg.rollout, replicas=pd.prefill_replicas + pd.decode_replicas
        )
        if rollout.name == "vllm" and rollout.block_size is None:
            # vLLM's KV connectors move whole blocks of a prompt: its CPU default
            # (128) would move nothing for prompts up to 129 tokens.
            rollout = dataclasses.replace(rollout, block_size=PD_BLOCK_SIZE)
        cfg = dataclasses.replace(cfg, rollout=rollout)
    if cfg.rollout.dtype == "auto":
        bf16 = cfg.trainer.mixed_precision == "bf16"
        dtype = "bfloat16" if bf16 else cfg.model.dtype
        cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, dtype=dtype))
    return cfg


def _split_overrides(overrides: list[str]) -> tuple[list[str], list[str], list[str]]:
    """Group choices (``algo=grpo``), value overrides (``a.b=1``) and malformed ones."""
    choices, values, bad = [], [], []
    for item in overrides:
        key, sep, _ = item.partition("=")
        key = key.lstrip("+~")
        if not sep or not key:
            hint = "overrides look like key=value (e.g. trainer.total_steps=20)"
            if item.endswith("]") or item.startswith(","):
                hint += (
                    "; a list written with spaces ([a, b]) is split by the shell: write key=[a,b]"
                )
            elif item.startswith("--"):
                hint = f"no such option; the options are {', '.join(OPTIONS)}"
                close = difflib.get_close_matches(item, OPTIONS, n=1)
                if close:
                    hint = f"no such option; did you mean {close[0]}?"
            bad.append(f"{item!r}: {hint}")
        elif "." not in key and key in GROUPS:
            choices.append(item)
        else:
            values.append(item)
    return choices, values, bad


def compose_dict(overrides: list[str]) -> dict[str, object]:
    """Hydra composition + dotted overrides, as a plain dict (not yet validated).
    ``overrides`` may hold ``--config-dir PATH`` (see ``search_path``)."""
    from hydra import compose as hydra_compose
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    user_dirs, overrides = split_config_dirs(overrides)
    path = search_path(user_dirs)
    choices, values, bad = _split_overrides(overrides)
    if bad:
        raise ConfigError(bad)
    problems = []
    for item in choices:
        group, _, option = item.partition("=")
        group = group.lstrip("+~")
        if not any((folder / group / f"{option}.yaml").exists() for folder in path):
            available = ", ".join(presets(group, path))
            problems.append(f"{group}={option}: no such preset; available: {available}")
    if problems:
        raise ConfigError(problems)
    try:
        with _hydra_search(path):
            composed = hydra_compose(config_name="config", overrides=choices)
    except HydraException as exc:
        raise ConfigError([str(exc)]) from exc
    OmegaConf.set_struct(composed, False)
    merged = OmegaConf.merge(composed, OmegaConf.create(parse_values(values)))
    raw = OmegaConf.to_container(merged, resolve=True)
    assert isinstance(raw, dict)
    raw.pop("hydra", None)
    return {str(k): v for k, v in raw.items()}


def parse_values(values: list[str]) -> dict[str, object]:
    """``key=value`` overrides as a nested dict, each value read as Hydra reads one
    (``[a,b]``, ``{a:1,b:2}``, numbers, ``null``, quoted strings). A value Hydra's
    grammar cannot read is the text itself: a prompt such as
    ``data.prompt_template=Q: {question}`` needs no quoting."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    out: dict[str, Any] = {}  # values as Hydra's grammar reads them, nested by key
    for item in values:
        key, _, text = item.lstrip("+").partition("=")
        try:
            override = parser.parse_override(f"{key}={text}")
            # a, b is a sweep to Hydra, a list typed without brackets here (the schema says so)
            value = text if override.is_sweep_override() else override.value()
        except HydraException:
            value = text
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            child = node.get(part)
            node = node.setdefault(part, {}) if isinstance(child, dict) or child is None else {}
        node[leaf] = value
    return out


def compose(overrides: list[str] | None = None) -> Config:
    """Compose and validate the config, as ``python -m rlpost.main`` does."""
    return from_dict(compose_dict(list(overrides or [])))


def to_dict(cfg: Config) -> dict[str, Any]:
    """Every config key of ``cfg`` as plain data (what ``from_dict`` reads back)."""
    out = as_dict(cfg)
    for group, name in FIELDS.items():
        out[group] = out.pop(name)
    return out


def keys_markdown() -> str:
    """The table of every config key in docs/configuration.md (a test keeps the two in sync)."""
    from rlpost.config.schema import describe

    lines = ["| key | type | meaning |", "| --- | --- | --- |"]
    for name, schema in SCHEMAS.items():
        for key, tp, text in describe(schema, name):
            lines.append(f"| `{key}` | {tp} | {text} |")
    return "\n".join(lines)
