"""Weights in the layout of a model's checkpoint files, the format every rollout
engine and every export reads.

transformers 5 loads some checkpoints into a different in-memory layout than
the files hold: a Qwen3-MoE or Mixtral layer keeps its experts as one fused
``mlp.experts.gate_up_proj`` tensor of shape ``[experts, 2 * inter, hidden]``
where the files have ``mlp.experts.{e}.gate_proj.weight`` and
``...up_proj.weight`` per expert. An engine given the in-memory names finds no
parameter for them, so weights leave the trainer in the checkpoint layout
(``to_checkpoint_format``) and an engine that runs a transformers model maps
them back (``CheckpointLayout``).

Hub checkpoints of CLIP and SigLIP vision towers (LLaVA, Gemma 3) nest them
under ``vision_tower.vision_model.``; transformers 5 drops that level in memory
and saves it only for a model it loaded from such names. A model built from a
config, or loaded from a directory transformers 5 wrote, comes out as
``vision_tower.embeddings.*``, which vLLM 0.32 cannot load. ``use_hub_layout``
makes every conversion here (weight sync, ``save_pretrained``) write the
nested names.
"""

from __future__ import annotations

from bisect import bisect_right
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

if TYPE_CHECKING:
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        PreTrainedConfig,
        PreTrainedModel,
    )


_M = TypeVar("_M", bound=torch.nn.Module)


def _base(model: torch.nn.Module) -> Any:
    """The transformers model under a PEFT wrapper (or the model itself).

    Untyped: its parts are reached by name (``.model``, ``.language_model``), which
    torch types as ``Tensor | Module`` on an ``nn.Module``, and it goes on to
    transformers functions that take a ``PreTrainedModel``."""
    unwrap = getattr(model, "get_base_model", None)  # a PEFT wrapper's
    return model if unwrap is None else unwrap()


def is_vision_language(model_path: str) -> bool:
    """Whether the checkpoint's config has a vision tower (``vision_config``)."""
    from transformers import PretrainedConfig

    config, _ = PretrainedConfig.get_config_dict(model_path)
    return "vision_config" in config


PLACEHOLDER_KEYS = ("image_token_id", "video_token_id", "image_token_index", "video_token_index")


def placeholder_token_ids(config: dict[str, object] | PreTrainedConfig) -> list[int]:
    """The tokens a VL model replaces by image or video features (from its config,
    a dict or a ``PretrainedConfig``). A sampled one would be read as an image
    slot on the next forward pass, so neither side ever samples them."""
    values = config if isinstance(config, dict) else vars(config)
    return sorted({v for k in PLACEHOLDER_KEYS if isinstance(v := values.get(k), int)})


def auto_class(
    model_path: str,
) -> type[AutoModelForCausalLM] | type[AutoModelForImageTextToText]:
    """The transformers auto class of the checkpoint: causal LM, or image-text-to-text
    for a vision-language checkpoint (which ``AutoModelForCausalLM`` lacks)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    if is_vision_language(model_path):
        from rlpost.runtime.vl_compat import install

        install()  # some VL processing modules import torchvision
        return AutoModelForImageTextToText
    return AutoModelForCausalLM


def save_preprocessing(src_dir: str, out_dir: str | Path) -> None:
    """Copy what turns inputs into model inputs from ``src_dir`` to ``out_dir``: the
    tokenizer, and a vision-language model's processor (image processor, chat
    template) too."""
    from transformers import AutoProcessor, AutoTokenizer

    AutoTokenizer.from_pretrained(src_dir).save_pretrained(out_dir)
    if is_vision_language(src_dir):
        from rlpost.runtime.vl_compat import install

        install()
        AutoProcessor.from_pretrained(src_dir).save_pretrained(out_dir)


def load_model(model_path: str, dtype: torch.dtype) -> PreTrainedModel:
    """The checkpoint's transformers model (``auto_class``).

    A model that caps its attention logits (Gemma 2's ``attn_logit_softcapping``)
    runs eager attention: transformers' default, SDPA, leaves the cap out, and the
    trainer's log-probs then differed from vLLM's (which applies it) by 1e-3 on a
    tiny random Gemma 2, more where attention logits are large.
    """
    from transformers import AutoConfig

    text_config = AutoConfig.from_pretrained(model_path).get_text_config()
    capped = getattr(text_config, "attn_logit_softcapping", None)
    kwargs = {"attn_implementation": "eager"} if capped else {}
    return auto_class(model_path).from_pretrained(model_path, dtype=dtype, **kwargs)


def language_model(model: torch.nn.Module) -> Any:
    """The decoder stack of a causal LM or of a VL model (``model.language_model``);
    untyped as ``_base``'s model is (its ``.layers`` are read by name)."""
    inner = _base(model).model
    return getattr(inner, "language_model", inner)


def vision_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Every parameter outside the language model and its head: the vision tower
    and the projector of a VL model (none for a causal LM)."""
    base = _base(model)
    keep = {id(p) for p in language_model(base).parameters()}
    head = base.get_output_embeddings()
    if head is not None:
        keep |= {id(p) for p in head.parameters()}
    return [p for p in base.parameters() if id(p) not in keep]


# The level hub checkpoints of CLIP-family vision towers (CLIP, SigLIP) keep and
# transformers 5 removes on load (its ``PrefixChange(prefix_to_remove=...)``).
NESTED_TOWER_PREFIX = "vision_model"


def use_hub_layout(model: _M) -> _M:
    """Make ``model`` (in place; returned) convert and save its CLIP-family vision
    towers under ``vision_model.`` as hub checkpoints and vLLM name them, however
    it was built or loaded. Idempotent; nothing changes for other models.

    transformers keeps, on a loaded model, the conversions the checkpoint's names
    used, and reverses them to save; the tower's nesting is one of them only when
    the checkpoint had it. Here it is added whenever transformers' own mapping for
    the model has it.
    """
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import PrefixChange

    base = _base(model)
    mapping = get_model_conversion_mapping(base, add_legacy=False)
    nesting = [
        c
        for c in mapping
        if isinstance(c, PrefixChange) and c.prefix_to_remove == NESTED_TOWER_PREFIX
    ]
    if not nesting:
        return model
    current = getattr(base, "_weight_conversions", None)
    if current is None:  # built from a config: transformers' mapping, as it would save
        current = [c for c in mapping if not isinstance(c, PrefixChange)]
    have = {(repr(c), c.scope_prefix) for c in current}
    base._weight_conversions = list(current) + [
        c for c in nesting if (repr(c), c.scope_prefix) not in have
    ]
    return model


def to_checkpoint_format(
    model: torch.nn.Module, state: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """``state`` (the model's own parameter names) renamed and split as its
    checkpoint files hold it; unchanged for models without a conversion.

    Tied copies (``lm_head.weight`` where the embeddings are tied) stay in: an
    engine whose head is a module sharing the embedding's weight (vLLM's Qwen2)
    refreshes that module only when its name arrives; an engine without such a
    module drops the name (``rollout/vllm/worker_ext.py``). CLIP-family vision
    towers get their hub names (``use_hub_layout``).
    """
    from transformers.core_model_loading import revert_weight_conversion

    return revert_weight_conversion(_base(use_hub_layout(model)), dict(state))


class CheckpointLayout:
    """Where each checkpoint-format tensor lands in ``model``'s parameters.

    Built once by converting a state dict of element indices: every element of
    every parameter gets its own number, the conversion moves the numbers
    exactly as it moves weights, and a checkpoint tensor's numbers then say
    which parameter elements it holds. This needs nothing per architecture.
    """

    def __init__(self, model: torch.nn.Module):
        state = model.state_dict(keep_vars=True)  # tied names included
        self.params: dict[str, torch.Tensor] = {}
        numbered: dict[str, torch.Tensor] = {}
        start = 0
        for name, tensor in state.items():
            if not isinstance(tensor, torch.nn.Parameter):
                continue  # buffers (rotary tables, ...) are not synced
            n = tensor.numel()
            numbered[name] = torch.arange(start, start + n, dtype=torch.int64).view(tensor.shape)
            self.params[name] = tensor
            start += n
        starts = {name: int(t.flatten()[0]) for name, t in numbered.items() if t.numel()}
        self._starts = sorted((start, name) for name, start in starts.items())
        self.places: dict[str, tuple[str, torch.Tensor]] = {}
        for ckpt_name, idx in to_checkpoint_format(model, numbered).items():
            owner = self._owner(int(idx.flatten()[0]))
            local = idx - starts[owner]
            if local.min() < 0 or local.max() >= self.params[owner].numel():
                raise NotImplementedError(
                    f"checkpoint tensor {ckpt_name} spans several parameters; "
                    "this engine cannot load it"
                )
            self.places[ckpt_name] = (owner, local)

    def _owner(self, index: int) -> str:
        """The parameter whose index range holds ``index``."""
        return self._starts[bisect_right(self._starts, (index, "\uffff")) - 1][1]

    @torch.no_grad()
    def load(self, named_tensors: list[tuple[str, torch.Tensor]]) -> dict[str, int]:
        """Copy checkpoint-format tensors into the parameters; returns how many
        elements of each parameter were written. A name or shape that fits nowhere
        is a KeyError or ValueError naming it."""
        unknown = [name for name, _ in named_tensors if name not in self.places]
        if unknown:
            raise KeyError(f"weights with no matching parameter: {unknown[:5]}")
        written: dict[str, int] = {}
        for name, tensor in named_tensors:
            owner, local = self.places[name]
            if tuple(tensor.shape) != tuple(local.shape):
                raise ValueError(
                    f"weight {name} has shape {tuple(tensor.shape)}, the model expects "
                    f"{tuple(local.shape)}"
                )
            param = self.params[owner]
            flat = param.data.view(-1)
            flat[local.flatten().to(flat.device)] = tensor.flatten().to(flat.device, flat.dtype)
            written[owner] = written.get(owner, 0) + local.numel()
        return written

    def unwritten(self, written: dict[str, int]) -> list[str]:
        """Parameters not wholly written by ``load`` (a tied twin's write counts)."""
        done: dict[int, int] = {}
        for name, n in written.items():
            done[id(self.params[name])] = done.get(id(self.params[name]), 0) + n
        return sorted(n for n, p in self.params.items() if done.get(id(p), 0) < p.numel())


def model_from_checkpoint_weights(
    config: PreTrainedConfig,
    weights: list[tuple[str, torch.Tensor]],
    dtype: torch.dtype = torch.float32,
) -> PreTrainedModel:
    """A causal LM built from ``config`` with ``weights`` (checkpoint-format names, as
    ``to_checkpoint_format`` gives them) copied in; a parameter they leave unwritten
    is a RuntimeError naming it (a tied head counts as written with the embedding)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    layout = CheckpointLayout(model)  # checkpoint names -> the model's own parameters
    missing = layout.unwritten(layout.load(weights))
    if missing:
        raise RuntimeError(f"no weights for {missing[:5]}")
    return model
