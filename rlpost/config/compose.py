"""Config schema (one dataclass per Hydra group) and composition.

Hydra composes ``configs/config.yaml`` with the group choices named on the
command line; ``key=value`` overrides are merged afterwards without struct
checks, so that *every* unknown or bad key is reported at once by the schema
validator instead of Hydra stopping at the first one.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

from rlpost.config.checks import cross_checks
from rlpost.config.groups import FIELDS, GROUPS, OPTIONAL_GROUPS, SCHEMAS, Config
from rlpost.config.schema import ConfigError, validate

# rollout.block_size under rollout.pd.enabled (vLLM) when not given: the CPU
# backend's smallest block (a GPU takes 16 too).
PD_BLOCK_SIZE = 32


OPTIONS = ("--help", "--help-keys")  # the CLI's own flags (``rlpost.main``)


def config_dir() -> Path:
    """``configs/`` of the checkout, or ``$RLPOST_CONFIG_DIR``."""
    env = os.environ.get("RLPOST_CONFIG_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "configs"


def from_dict(raw: dict[str, Any]) -> Config:
    """Validate a plain nested dict; raises ConfigError listing every problem."""
    problems: list[str] = []
    for key in raw:
        if key not in SCHEMAS:
            problems.append(f"{key}: unknown config group; groups are {', '.join(SCHEMAS)}")
    groups: dict[str, Any] = {}
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


def compose_dict(overrides: list[str]) -> dict[str, Any]:
    """Hydra composition + dotted overrides, as a plain dict (not yet validated)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    choices, values, bad = _split_overrides(overrides)
    if bad:
        raise ConfigError(bad)
    problems = []
    for item in choices:
        group, _, option = item.partition("=")
        group = group.lstrip("+~")
        if not (config_dir() / group / f"{option}.yaml").exists():
            available = sorted(p.stem for p in (config_dir() / group).glob("*.yaml"))
            problems.append(f"{group}={option}: no such preset; available: {', '.join(available)}")
    if problems:
        raise ConfigError(problems)
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            composed = hydra_compose(config_name="config", overrides=choices)
    except HydraException as exc:
        raise ConfigError([str(exc)]) from exc
    OmegaConf.set_struct(composed, False)
    merged = OmegaConf.merge(composed, OmegaConf.from_dotlist([v.lstrip("+") for v in values]))
    raw = OmegaConf.to_container(merged, resolve=True)
    assert isinstance(raw, dict)
    raw.pop("hydra", None)
    return {str(k): v for k, v in raw.items()}


def compose(overrides: list[str] | None = None) -> Config:
    """Compose and validate the config, as ``python -m rlpost.main`` does."""
    return from_dict(compose_dict(list(overrides or [])))


def to_dict(cfg: Config) -> dict[str, Any]:
    import dataclasses

    out = dataclasses.asdict(cfg)
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
