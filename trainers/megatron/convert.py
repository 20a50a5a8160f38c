"""HF <-> Megatron-core weight conversion for the Qwen2 / Qwen3 / Llama / Mistral family
and the Qwen3-MoE family (router and experts).

Pure tensor reshuffling, no megatron import: the tests run it on its own.

Three layouts appear here:

- **HF**: the model's checkpoint names (``model.layers.3.self_attn.q_proj.weight``),
  what ``rlpost.runtime.hf_format.to_checkpoint_format`` gives and rollout engines load.
- **Megatron, full**: megatron-core ``GPTModel`` names built with the local
  (non-Transformer-Engine) layer spec, every tensor whole, layer indices global
  (``decoder.layers.3.self_attention.linear_qkv.weight``); what a model at
  tensor and pipeline parallel size 1 holds.
- **Megatron, sharded**: what one rank holds: the tensor-parallel slice of a
  tensor (``tp_split``) and, under pipeline parallelism, only its stage's layers
  with indices counted from 0 in the stage (``to_local`` / ``to_global``).

Megatron fuses attention's Q, K and V into one ``linear_qkv`` whose output rows
are grouped by key/value head ("query group"): for each group g, its
``heads / kv_heads`` query heads, then its key head, then its value head.
Tensor parallelism then gives each rank whole groups, so a plain split along
rows is the sharding. The MLP's ``linear_fc1`` is ``[gate; up]`` and each rank
holds ``[gate_r; up_r]`` (its slice of each), which is not a plain split.

A Qwen3-MoE layer's MLP is megatron's ``MoELayer``: the router
(``mlp.router.weight``, HF ``mlp.gate.weight``) and experts whose ``linear_fc1``
/ ``linear_fc2`` are laid out like the dense MLP's. Under expert parallelism a
rank holds ``experts / ep`` of them, numbered from 0 on each rank
(``mlp.experts.local_experts.{j}``); ``to_global`` also maps those numbers to
the model-wide expert index.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

FAMILIES = ("qwen2", "qwen3", "llama", "mistral", "qwen3_moe")

_LAYER = re.compile(r"^(decoder\.layers\.)(\d+)(\..*)$")
_EXPERT = re.compile(r"^(.*\.local_experts\.)(\d+)(\..*)$")


@dataclass(frozen=True)
class ModelShape:
    """What the conversion and ``TransformerConfig`` need from an HF config."""

    family: str
    num_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    eps: float
    rope_theta: float
    max_positions: int
    tied: bool
    qkv_bias: bool  # Qwen2: q, k and v projections carry a bias, the output projection none
    qk_norm: bool  # Qwen3: RMSNorm over each query and key head before rotary
    experts: int = 0  # MoE: routed experts per layer (0: a dense MLP)
    top_k: int = 0  # MoE: experts per token
    moe_ffn: int = 0  # MoE: each expert's MLP width
    norm_topk: bool = True  # MoE: the top-k routing weights renormalised to sum to 1

    @property
    def groups(self) -> int:
        return self.kv_heads


def shape_from_hf(config: PreTrainedConfig) -> ModelShape:
    """Read a transformers config; a feature the conversion does not map is a
    ``NotImplementedError`` naming it."""
    family = config.model_type
    if family not in FAMILIES:
        raise NotImplementedError(
            f"model_type={family!r}: the Megatron trainer converts {', '.join(FAMILIES)} models; "
            "use trainer=fsdp for this one"
        )
    problems = []
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        problems.append(f"rope_type={rope.get('rope_type')!r} (only plain RoPE is mapped)")
    if getattr(config, "use_sliding_window", False) or (
        family == "mistral" and getattr(config, "sliding_window", None)
    ):
        problems.append("sliding-window attention")
    if getattr(config, "hidden_act", "silu") != "silu":
        problems.append(f"hidden_act={config.hidden_act!r} (only silu)")
    if family != "qwen2" and getattr(config, "attention_bias", False):
        problems.append("attention_bias=True (a bias on the output projection)")
    if getattr(config, "mlp_bias", False):
        problems.append("mlp_bias=True")
    experts = getattr(config, "num_experts", 0) or 0
    if family == "qwen3_moe":
        if getattr(config, "decoder_sparse_step", 1) != 1 or getattr(config, "mlp_only_layers", []):
            problems.append(
                "dense layers between the MoE layers (decoder_sparse_step, mlp_only_layers)"
            )
    if problems:
        raise NotImplementedError(f"{family} model with {'; '.join(problems)}: not converted")
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return ModelShape(
        family=family,
        num_layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        heads=heads,
        kv_heads=config.num_key_value_heads or heads,
        head_dim=head_dim,
        ffn=config.intermediate_size,
        vocab=config.vocab_size,
        eps=config.rms_norm_eps,
        rope_theta=float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
        max_positions=config.max_position_embeddings,
        tied=bool(config.tie_word_embeddings),
        qkv_bias=family == "qwen2",
        qk_norm=family in ("qwen3", "qwen3_moe"),
        experts=experts,
        top_k=getattr(config, "num_experts_per_tok", 0) if experts else 0,
        moe_ffn=getattr(config, "moe_intermediate_size", 0) if experts else 0,
        norm_topk=bool(getattr(config, "norm_topk_prob", True)),
    )


# -- fused QKV --------------------------------------------------------------------
def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: ModelShape) -> torch.Tensor:
    """HF q/k/v projections (weights ``[n * d, h]`` or biases ``[n * d]``) -> Megatron's
    ``linear_qkv``: rows ordered by query group, ``[q_g (heads/groups * d); k_g (d); v_g (d)]``."""
    rest = q.shape[1:]
    per_group = s.heads // s.groups
    q_g = q.reshape(s.groups, per_group * s.head_dim, *rest)
    k_g = k.reshape(s.groups, s.head_dim, *rest)
    v_g = v.reshape(s.groups, s.head_dim, *rest)
    return torch.cat([q_g, k_g, v_g], dim=1).reshape(-1, *rest)


def split_qkv(qkv: torch.Tensor, s: ModelShape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of ``fuse_qkv``."""
    rest = qkv.shape[1:]
    per_group = s.heads // s.groups
    grouped = qkv.reshape(s.groups, (per_group + 2) * s.head_dim, *rest)
    q, k, v = torch.split(grouped, [per_group * s.head_dim, s.head_dim, s.head_dim], dim=1)
    return (
        q.reshape(-1, *rest).clone(),
        k.reshape(-1, *rest).clone(),
        v.reshape(-1, *rest).clone(),
    )


# -- name maps ----------------------------------------------------------------------
# Per-layer tensors that map one to one (HF suffix -> Megatron suffix).
_LAYER_MAP = {
    "input_layernorm.weight": "input_layernorm.weight",
    "post_attention_layernorm.weight": "pre_mlp_layernorm.weight",
    "self_attn.o_proj.weight": "self_attention.linear_proj.weight",
    "mlp.down_proj.weight": "mlp.linear_fc2.weight",
    "self_attn.q_norm.weight": "self_attention.q_layernorm.weight",
    "self_attn.k_norm.weight": "self_attention.k_layernorm.weight",
}


def hf_to_megatron(hf: dict[str, torch.Tensor], s: ModelShape) -> dict[str, torch.Tensor]:
    """HF checkpoint tensors -> full Megatron tensors (global layer indices).

    Raises ``KeyError`` naming the HF tensors that no Megatron tensor took, so a
    model with parts this mapping does not know is never half-converted.
    """
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        used.add(name)
        return hf[name]

    out = {"embedding.word_embeddings.weight": take("model.embed_tokens.weight")}
    for i in range(s.num_layers):
        hp, mp = f"model.layers.{i}.", f"decoder.layers.{i}."
        for hf_suffix, mg_suffix in _LAYER_MAP.items():
            if hp + hf_suffix in hf:
                out[mp + mg_suffix] = take(hp + hf_suffix)
        attn = hp + "self_attn."
        out[mp + "self_attention.linear_qkv.weight"] = fuse_qkv(
            take(attn + "q_proj.weight"),
            take(attn + "k_proj.weight"),
            take(attn + "v_proj.weight"),
            s,
        )
        if s.qkv_bias:
            out[mp + "self_attention.linear_qkv.bias"] = fuse_qkv(
                take(attn + "q_proj.bias"),
                take(attn + "k_proj.bias"),
                take(attn + "v_proj.bias"),
                s,
            )
        if s.experts:
            out[mp + "mlp.router.weight"] = take(hp + "mlp.gate.weight")
            for e in range(s.experts):
                he, me = f"{hp}mlp.experts.{e}.", f"{mp}mlp.experts.local_experts.{e}."
                out[me + "linear_fc1.weight"] = torch.cat(
                    [take(he + "gate_proj.weight"), take(he + "up_proj.weight")]
                )
                out[me + "linear_fc2.weight"] = take(he + "down_proj.weight")
        else:
            out[mp + "mlp.linear_fc1.weight"] = torch.cat(
                [take(hp + "mlp.gate_proj.weight"), take(hp + "mlp.up_proj.weight")]
            )
    out["decoder.final_layernorm.weight"] = take("model.norm.weight")
    if s.tied:
        used.add("lm_head.weight")  # a copy of the embedding when present
    else:
        out["output_layer.weight"] = take("lm_head.weight")
    left = sorted(set(hf) - used)
    if left:
        raise KeyError(f"HF tensors with no Megatron counterpart: {left[:5]}")
    return out


def megatron_to_hf(mg: dict[str, torch.Tensor], s: ModelShape) -> dict[str, torch.Tensor]:
    """Full Megatron tensors -> HF checkpoint tensors (inverse of ``hf_to_megatron``).

    A tied model gets no ``lm_head.weight``: its checkpoint files hold the
    embedding once (the weight sync adds the copy, see ``named_weights``).
    """
    return {n: t for part in parts(s) for n, t in part_to_hf(part, mg, s).items()}


# The parts a model's tensors convert in, one at a time (a layer index in between).
EMBEDDING, HEAD = "embedding", "head"


def parts(s: ModelShape) -> list[int | str]:
    """The model's parts in order: the embedding, each decoder layer, the head."""
    return [EMBEDDING, *range(s.num_layers), HEAD]


def part_of(name: str) -> int | str:
    """The part a model-wide Megatron tensor name belongs to: ``EMBEDDING``, a
    decoder layer's index, or ``HEAD`` (the final norm and output layer)."""
    m = _LAYER.match(name)
    if m:
        return int(m[2])
    return EMBEDDING if name.startswith("embedding.") else HEAD


def part_to_hf(
    part: int | str, mg: dict[str, torch.Tensor], s: ModelShape
) -> dict[str, torch.Tensor]:
    """The HF checkpoint tensors of one part (``part_of``) from its full Megatron
    tensors (``mg`` may hold other parts too)."""
    if part == EMBEDDING:
        return {"model.embed_tokens.weight": mg["embedding.word_embeddings.weight"]}
    if part == HEAD:
        out = {"model.norm.weight": mg["decoder.final_layernorm.weight"]}
        if not s.tied:
            out["lm_head.weight"] = mg["output_layer.weight"]
        return out
    hp, mp = f"model.layers.{part}.", f"decoder.layers.{part}."
    out = {}
    inverse = {v: k for k, v in _LAYER_MAP.items()}
    for mg_suffix, hf_suffix in inverse.items():
        if mp + mg_suffix in mg:
            out[hp + hf_suffix] = mg[mp + mg_suffix]
    attn = hp + "self_attn."
    q, k, v = split_qkv(mg[mp + "self_attention.linear_qkv.weight"], s)
    out.update({attn + "q_proj.weight": q, attn + "k_proj.weight": k, attn + "v_proj.weight": v})
    if s.qkv_bias:
        q, k, v = split_qkv(mg[mp + "self_attention.linear_qkv.bias"], s)
        out.update({attn + "q_proj.bias": q, attn + "k_proj.bias": k, attn + "v_proj.bias": v})
    if s.experts:
        out[hp + "mlp.gate.weight"] = mg[mp + "mlp.router.weight"]
        for e in range(s.experts):
            he, me = f"{hp}mlp.experts.{e}.", f"{mp}mlp.experts.local_experts.{e}."
            gate, up = mg[me + "linear_fc1.weight"].chunk(2)
            out[he + "gate_proj.weight"] = gate.clone()
            out[he + "up_proj.weight"] = up.clone()
            out[he + "down_proj.weight"] = mg[me + "linear_fc2.weight"]
    else:
        gate, up = mg[mp + "mlp.linear_fc1.weight"].chunk(2)
        out[hp + "mlp.gate_proj.weight"] = gate.clone()
        out[hp + "mlp.up_proj.weight"] = up.clone()
    return out


# -- tensor parallelism ---------------------------------------------------------------
def tp_layout(name: str) -> str:
    """How a Megatron tensor is split over tensor-parallel ranks.

    ``col``: rows split (column-parallel linear outputs, vocab-parallel embedding
    and output layer); ``glu``: ``[gate; up]`` rows, each half split; ``row``:
    columns split (row-parallel linear inputs); ``rep``: whole on every rank.
    """
    if name.endswith("linear_fc1.weight"):  # dense MLPs and experts alike
        return "glu"
    if name.endswith(
        ("linear_qkv.weight", "linear_qkv.bias", "word_embeddings.weight", "output_layer.weight")
    ):
        return "col"
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return "row"
    return "rep"


def tp_split(name: str, full: torch.Tensor, tp: int) -> list[torch.Tensor]:
    """The ``tp`` shards of a full Megatron tensor, rank order."""
    layout = tp_layout(name)
    if layout == "rep":
        return [full] * tp
    if layout == "row":
        return [c.contiguous() for c in full.chunk(tp, dim=1)]
    if layout == "col":
        return [c.contiguous() for c in full.chunk(tp, dim=0)]
    gate, up = full.chunk(2)
    return [torch.cat([g, u]) for g, u in zip(gate.chunk(tp), up.chunk(tp))]


def tp_merge(name: str, shards: list[torch.Tensor]) -> torch.Tensor:
    """Inverse of ``tp_split``: the full tensor from its shards in rank order."""
    if tp_layout(name) == "rep":
        return shards[0]
    full = shards[0].new_empty(tp_full_shape(name, tuple(shards[0].shape), len(shards)))
    for views, shard in zip(tp_views(name, full, len(shards)), shards, strict=True):
        for view, piece in zip(views, tp_pieces(name, shard), strict=True):
            view.copy_(piece)
    return full


def tp_full_shape(name: str, shard: tuple[int, ...], tp: int) -> tuple[int, ...]:
    """The full tensor's shape from one shard's (a split tensor's, not ``rep``)."""
    if tp_layout(name) == "row":
        return (shard[0], shard[1] * tp, *shard[2:])
    return (shard[0] * tp, *shard[1:])


def tp_views(name: str, full: torch.Tensor, tp: int) -> list[list[torch.Tensor]]:
    """Where each rank's shard lies in ``full``: views, one per ``tp_pieces`` piece,
    rank order (a ``glu`` shard is two pieces, its gate rows and its up rows)."""
    layout = tp_layout(name)
    if layout == "glu":
        gate, up = full.chunk(2)
        return [[g, u] for g, u in zip(gate.chunk(tp), up.chunk(tp))]
    return [[c] for c in full.chunk(tp, dim=1 if layout == "row" else 0)]


def tp_pieces(name: str, shard: torch.Tensor) -> list[torch.Tensor]:
    """A shard in the pieces ``tp_views`` places."""
    return list(shard.chunk(2)) if tp_layout(name) == "glu" else [shard]


# -- pipeline and expert parallelism ----------------------------------------------------
def to_global(name: str, offset: int, expert_offset: int = 0) -> str:
    """A rank's name (layer index counted in its pipeline stage, expert index among
    its experts) -> the model-wide name."""
    m = _LAYER.match(name)
    name = f"{m[1]}{int(m[2]) + offset}{m[3]}" if m else name
    e = _EXPERT.match(name)
    return f"{e[1]}{int(e[2]) + expert_offset}{e[3]}" if e else name


def to_local(name: str, offset: int, expert_offset: int = 0) -> str:
    """Inverse of ``to_global``."""
    return to_global(name, -offset, -expert_offset)


def is_expert(name: str) -> bool:
    """Whether ``name`` is an expert's tensor (split over expert-parallel ranks)."""
    return _EXPERT.match(name) is not None
