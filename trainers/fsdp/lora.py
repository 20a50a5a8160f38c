"""LoRA through PEFT: wrapping, and the two weight views a rollout engine needs.

Legend: o = output features, i = input features, r = LoRA rank.

A PEFT-wrapped model names its tensors ``base_model.model.<hf name>`` and
splits each adapted linear layer into ``<layer>.base_layer.weight`` and
``<layer>.lora_{A,B}.<adapter>.weight``. ``merged_hf_weights`` folds the
adapter into the base weights under the plain HF names (what an engine
without LoRA loads); ``adapter_tensors`` returns the adapter alone under the
names PEFT writes to ``adapter_model.safetensors`` (what vLLM's LoRA loads).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from rlpost.runtime.hf_format import language_model
from rlpost.trainers.lora_settings import LoraSettings as LoraSettings  # re-exported

PEFT_PREFIX = "base_model.model."
ADAPTER = "default"


def apply_lora(model: torch.nn.Module, lora: LoraSettings, base_model_path: str):
    """Wrap ``model`` in a PEFT LoRA model; only ``lora_A``/``lora_B`` require grad."""
    from peft import get_peft_model

    config = lora.peft_config(base_model_path)
    if config.target_modules == "all-linear":
        config.target_modules = all_linear_targets(model)
    with _targets_as_named():
        peft_model = get_peft_model(model, config)  # type: ignore[arg-type]
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    bad = [n for n in trainable if ".lora_A." not in n and ".lora_B." not in n]
    if bad or not trainable:
        raise RuntimeError(f"LoRA left non-adapter parameters trainable: {bad[:5]}")
    return peft_model


@contextmanager
def _targets_as_named() -> Iterator[None]:
    """Keep PEFT from renaming the targets of a new adapter on a MoE model.

    For MoE models whose layout changed in transformers 5, PEFT maps targets named
    like the old per-expert layers (``down_proj``, ``gate_proj``, ...) to the fused
    expert tensors, so that adapters trained on the old layout still load. For a
    new adapter on the model's own module names that mapping is wrong: it drops
    the dense and shared-expert MLPs a name list selects and adapts the fused
    experts instead, which no merged sync or vLLM adapter can take.
    """
    try:
        import peft.utils.transformers_weight_conversion as conversion
    except ImportError:  # a PEFT without the mapping: nothing to keep it from
        yield
        return
    convert = conversion.convert_peft_config_for_transformers
    conversion.convert_peft_config_for_transformers = lambda *args, **kwargs: None
    try:
        yield
    finally:
        conversion.convert_peft_config_for_transformers = convert


def all_linear_targets(model: torch.nn.Module) -> list[str]:
    """What ``all-linear`` adapts: the language model's ``nn.Linear`` layers.

    Not the head, not a VL model's vision tower (``model.freeze_vision`` keeps
    it as it is), and not the fused expert tensors of a MoE model, which
    PEFT's own ``all-linear`` adapts as parameters but no rollout engine can
    take as a merged update or an adapter. The layers' short names (``q_proj``,
    ...) are used, as PEFT writes them, unless a short name also names
    something else (a VL tower's ``q_proj``, a fused expert tensor
    ``experts.down_proj``): then the full module names.
    """
    inside = {id(m) for m in language_model(model).modules()}
    linear = {
        name
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and id(m) in inside
    }
    if not linear:
        raise ValueError(
            "model.lora.target_modules='all-linear' found no nn.Linear layer in the "
            "language model; list the module names to adapt instead"
        )
    short = {name.rsplit(".", 1)[-1] for name in linear}
    others = [name for name, _ in model.named_modules() if name not in linear]
    others += [name for name, _ in model.named_parameters() if name.rsplit(".", 1)[0] not in linear]
    if any(name.rsplit(".", 1)[-1] in short for name in others):
        return sorted(linear)
    return sorted(short)


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The transformer blocks (one FSDP2 shard group each), under a PEFT wrapper or not."""
    return language_model(model).layers


def _is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def merged_hf_weights(
    state: dict[str, torch.Tensor], lora: LoraSettings
) -> dict[str, torch.Tensor]:
    """HF-named weights with ``W + scaling * B @ A`` folded in (full tensors in, full out).

    The product is formed in float32, as PEFT's own merge does for low
    precisions, and cast back to the base weight's dtype.
    """
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if not _is_adapter(name):
            out[name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")] = tensor
    suffix_a = f".lora_A.{ADAPTER}.weight"
    for name, a_ri in state.items():
        if not name.endswith(suffix_a):
            continue
        module = name[: -len(suffix_a)]
        b_or = state[f"{module}.lora_B.{ADAPTER}.weight"]
        hf = module.removeprefix(PEFT_PREFIX) + ".weight"
        w_oi = out[hf]
        delta_oi = lora.scaling * (b_or.float() @ a_ri.float())
        out[hf] = (w_oi.float() + delta_oi).to(w_oi.dtype)
    return out


def adapter_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter alone, named as in PEFT's ``adapter_model.safetensors``."""
    return {
        name.replace(f".{ADAPTER}.", "."): tensor
        for name, tensor in state.items()
        if _is_adapter(name)
    }


def adapter_config(peft_model: torch.nn.Module) -> dict:
    """``adapter_config.json`` content of a live PEFT model, JSON-safe.

    Taken from the wrapped model, so ``all-linear`` is already resolved to the
    module names it matched (what vLLM needs to place the adapter).
    """
    config = peft_model.peft_config[ADAPTER].to_dict()  # type: ignore[index,operator,union-attr]
    return {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}


def save_adapter(out_dir: str | Path, tensors: dict[str, torch.Tensor], config: dict) -> Path:
    """Write a PEFT adapter directory (``adapter_config.json`` + safetensors)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in tensors.items()}, str(out / "adapter_model.safetensors")
    )
    (out / "adapter_config.json").write_text(json.dumps(config, indent=1))
    return out
