"""Checks of what the config names -- the model directory, the device, the
Megatron split, LoRA on MoE, the agent's tools and environment -- run before
Ray starts; each returns the problems it finds as config-error lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from rlpost.config.groups import Config
from rlpost.config.schema import ConfigError
from rlpost.device import DeviceSpec, resolve_device

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def check_device(cfg: Config) -> tuple[DeviceSpec | None, list[str]]:
    """``trainer.device`` resolved; a device this machine lacks is a config error."""
    try:
        return resolve_device(cfg.trainer.device), []
    except RuntimeError as exc:
        return None, [str(exc)]


def check_model_path(cfg: Config) -> None:
    """A local-looking model.path must hold an HF model; hub ids pass through."""
    path = cfg.model.path
    if not path:
        return
    p = Path(path).expanduser()
    if (path.startswith((".", "/", "~")) or p.exists()) and not (p / "config.json").exists():
        raise ConfigError([f"model.path={path!r}: no HF model (config.json) in that directory"])


def model_positions(cfg: Config) -> int | None:
    """The positions the model has (``max_position_embeddings``, a VL model's text
    part's), read from its config.json; None for a hub id (not downloaded here)."""
    if cfg.model.path is None:
        from rlpost.models.positions import TEXT_POSITIONS, VL_TEXT_POSITIONS
        from rlpost.models.warmup import VL_PRESETS

        return VL_TEXT_POSITIONS if cfg.model.preset in VL_PRESETS else TEXT_POSITIONS
    found = local_config(cfg)
    if found is None:
        return None
    config, text = found
    positions = text.get("max_position_embeddings") or config.get("max_position_embeddings")
    return int(positions) if positions else None


def local_config(cfg: Config) -> tuple[dict, dict] | None:
    """``model.path``'s config.json and its language model's part (a VL model's
    ``text_config``, else the whole); None without a local directory."""
    if cfg.model.path is None:
        return None
    config_file = Path(cfg.model.path).expanduser() / "config.json"
    if not config_file.is_file():
        return None
    config = json.loads(config_file.read_text())
    return config, config.get("text_config") or config


def check_model_length(cfg: Config) -> list[str]:
    """``rollout.max_model_len`` within the model's positions: an engine asked for
    more fails after Ray starts, deep inside its own start-up."""
    positions = model_positions(cfg)
    r, d = cfg.rollout, cfg.data
    if positions is None or r.max_model_len <= positions:
        return []
    model = (
        f"model.path={cfg.model.path}"
        if cfg.model.path
        else f"the built-in {cfg.model.preset!r} model"
    )
    fits = f"data.max_prompt_tokens + rollout.max_tokens = {d.max_prompt_tokens + r.max_tokens}"
    return [
        f"rollout.max_model_len={r.max_model_len}: {model} has {positions} positions "
        f"(max_position_embeddings); set rollout.max_model_len <= {positions} and keep "
        f"{fits} within it (lower data.max_prompt_tokens or rollout.max_tokens), or use a "
        "model with more positions"
    ]


def model_config(cfg: Config) -> PretrainedConfig:
    """The policy's transformers config: its config.json, or the built-in preset's."""
    if cfg.model.path is None:
        from rlpost.models.tiny import build_config, build_tokenizer

        return build_config(cfg.model.preset, build_tokenizer())
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(cfg.model.path)


def check_ulysses_model(cfg: Config) -> list[str]:
    """``trainer.ulysses=N``: a text model whose attention heads split over N ranks
    (the query heads in N; the key/value heads in N, or N in them, each rank then
    holding a copy of one) and without sliding-window layers (each rank attends
    over the whole sequence with a plain causal mask)."""
    n = cfg.trainer.ulysses
    if n == 1:
        return []
    from rlpost.models.warmup import VL_PRESETS

    model = cfg.model.path or f"the built-in {cfg.model.preset!r} model"
    key = f"trainer.ulysses={n} with {model}"
    vl = [f"{key}: a vision-language model's image tokens are not split over ranks; "
          "set trainer.ulysses=1"]  # fmt: skip
    if cfg.model.path is None and cfg.model.preset in VL_PRESETS:
        return vl
    hf = model_config(cfg)
    if getattr(hf, "vision_config", None) is not None:
        return vl
    text = getattr(hf, "text_config", None) or hf
    heads = int(text.num_attention_heads)
    kv = int(getattr(text, "num_key_value_heads", None) or heads)
    problems = []
    if heads % n:
        problems.append(f"{key}: its {heads} attention heads do not split over {n} ranks")
    if kv % n and n % kv:
        problems.append(
            f"{key}: its {kv} key/value heads do not split over {n} ranks, and {n} is not "
            f"a multiple of {kv}; choose trainer.ulysses dividing {kv} or a multiple of it"
        )
    layer_types = getattr(text, "layer_types", None) or []
    if "sliding_attention" in layer_types:
        problems.append(
            f"{key}: the model has sliding-window attention layers, which Ulysses does not "
            "mask; set trainer.ulysses=1"
        )
    return problems


def check_megatron_model(cfg: Config) -> list[str]:
    """``trainer=megatron``: the model is one the conversion knows and splits over
    trainer.megatron.tp and pp (read from its config.json, before any worker starts)."""
    if cfg.trainer.name != "megatron":
        return []
    from rlpost.trainers.megatron.config import check_divisible
    from rlpost.trainers.megatron.convert import shape_from_hf

    hf_config = model_config(cfg)
    mg = cfg.trainer.megatron
    try:
        check_divisible(shape_from_hf(hf_config), mg)
    except (NotImplementedError, ValueError) as exc:
        model = cfg.model.path or f"the built-in {cfg.model.preset!r} model"
        return [f"trainer.megatron.tp={mg.tp}, pp={mg.pp} with {model}: {exc}"]
    return []


def check_lora_adapter(cfg: Config, device_kind: str) -> list[str]:
    """``rollout.lora_sync=adapter`` on a MoE model is refused on the CPU: vLLM's CPU
    build runs LoRA on MoE layers only through a Triton kernel it lacks (it fails at
    the first request); merged syncs work there."""
    if not (cfg.model.lora.rank and cfg.rollout.lora_sync == "adapter" and cfg.model.path):
        return []
    found = local_config(cfg)
    if cfg.rollout.name != "vllm" or device_kind != "cpu" or found is None:
        return []
    _, text = found
    keys = ("num_experts", "num_local_experts", "n_routed_experts")
    if not any(text.get(k) for k in keys):
        return []
    return [
        f"rollout.lora_sync=adapter: model.path={cfg.model.path} is a mixture-of-experts model, "
        "and vLLM's CPU build serves LoRA adapters on those only through a Triton kernel it "
        "does not have; use rollout.lora_sync=merged"
    ]


def check_agent(cfg: Config) -> list[str]:
    """``agent.tools`` / ``agent.env`` / ``agent.program`` load, before any worker starts."""
    from rlpost.rollout.agent import EnvError, ToolError, get_parser
    from rlpost.rollout.agent.parsers import ParserError
    from rlpost.serving.agent_episodes import env_factory

    problems = []
    try:
        env_factory(cfg)
    except ToolError as exc:
        problems.append(f"agent.tools={list(cfg.agent.tools)}: {exc}")
    except EnvError as exc:
        problems.append(f"agent.env={cfg.agent.env}: {exc}")
    try:
        get_parser(cfg.agent.parser)
    except ParserError as exc:
        problems.append(f"agent.parser={cfg.agent.parser}: {exc}")
    if cfg.agent.program is not None:
        from rlpost.rollout.agent.program import ProgramError, load_program

        try:
            load_program(cfg.agent.program, cfg.agent.env_kwargs)
        except ProgramError as exc:
            problems.append(f"agent.program={cfg.agent.program}: {exc}")
        try:
            import aiohttp  # noqa: F401
            import openai  # noqa: F401
        except ImportError as exc:
            problems.append(
                f"agent.program needs the openai and aiohttp packages ({exc}); "
                "pip install 'rlpost[agents]'"
            )
    return problems
