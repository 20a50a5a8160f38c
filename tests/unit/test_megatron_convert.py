"""HF <-> Megatron weight conversion: hand-checked layouts and bit-equal round trips."""

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig

from rlpost.runtime.hf_format import to_checkpoint_format
from rlpost.trainers.megatron.convert import (
    fuse_qkv,
    hf_to_megatron,
    megatron_to_hf,
    shape_from_hf,
    split_qkv,
    to_global,
    to_local,
    tp_layout,
    tp_merge,
    tp_split,
)

SMALL = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def _hf_state(config) -> tuple[dict[str, torch.Tensor], object]:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    return to_checkpoint_format(model, model.state_dict()), model


def test_fused_qkv_orders_rows_by_query_group():
    # 4 query heads, 2 kv heads (2 queries per group), head_dim 1, hidden 1:
    # group 0 = q0 q1 k0 v0, group 1 = q2 q3 k1 v1
    shape = shape_from_hf(Qwen2Config(**{**SMALL, "hidden_size": 4}))
    shape = type(shape)(**{**shape.__dict__, "head_dim": 1})
    q = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    k = torch.tensor([[10.0], [11.0]])
    v = torch.tensor([[20.0], [21.0]])
    fused = fuse_qkv(q, k, v, shape)
    assert fused.flatten().tolist() == [0, 1, 10, 20, 2, 3, 11, 21]
    # tensor parallelism at 2 gives each rank one whole group
    assert [s.flatten().tolist() for s in tp_split("x.linear_qkv.weight", fused, 2)] == [
        [0, 1, 10, 20],
        [2, 3, 11, 21],
    ]
    for a, b in zip(split_qkv(fused, shape), (q, k, v)):
        assert torch.equal(a, b)


def test_gated_fc1_shards_hold_their_slice_of_gate_and_up():
    # fc1 = [gate; up] = [g0 g1 g2 g3; u0 u1 u2 u3] -> rank 0 [g0 g1 u0 u1], rank 1 [g2 g3 u2 u3]
    full = torch.tensor([0.0, 1, 2, 3, 10, 11, 12, 13])[:, None]
    shards = tp_split("decoder.layers.0.mlp.linear_fc1.weight", full, 2)
    assert [s.flatten().tolist() for s in shards] == [[0, 1, 10, 11], [2, 3, 12, 13]]
    assert torch.equal(tp_merge("decoder.layers.0.mlp.linear_fc1.weight", shards), full)


def test_row_parallel_splits_columns_and_norms_are_replicated():
    w = torch.arange(8.0).view(2, 4)
    name = "decoder.layers.1.self_attention.linear_proj.weight"
    assert [s.tolist() for s in tp_split(name, w, 2)] == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]
    norm = torch.ones(4)
    shards = tp_split("decoder.final_layernorm.weight", norm, 2)
    assert all(s is norm for s in shards)


def test_pipeline_layer_names_shift_by_the_stage_offset():
    name = "decoder.layers.1.mlp.linear_fc2.weight"
    assert to_global(name, 4) == "decoder.layers.5.mlp.linear_fc2.weight"
    assert to_local(to_global(name, 4), 4) == name
    assert to_global("embedding.word_embeddings.weight", 4) == "embedding.word_embeddings.weight"


def test_expert_names_shift_by_the_rank_first_expert():
    # ep=2 over 4 experts: rank 1 holds experts 2 and 3 as its local experts 0 and 1
    name = "decoder.layers.1.mlp.experts.local_experts.1.linear_fc1.weight"
    model_wide = "decoder.layers.5.mlp.experts.local_experts.3.linear_fc1.weight"
    assert to_global(name, 4, expert_offset=2) == model_wide
    assert to_local(model_wide, 4, expert_offset=2) == name
    assert to_global("decoder.layers.0.mlp.router.weight", 0, 2) == (
        "decoder.layers.0.mlp.router.weight"
    )
    # an expert's fc1 is [gate; up] like the dense MLP's, its fc2 row-parallel, the router whole
    assert tp_layout(model_wide) == "glu"
    assert tp_layout(model_wide.replace("fc1", "fc2")) == "row"
    assert tp_layout("decoder.layers.0.mlp.router.weight") == "rep"


@pytest.mark.parametrize(
    "config",
    [
        Qwen2Config(**SMALL, tie_word_embeddings=True),  # the built-in tiny model's layout
        Qwen2Config(**SMALL, tie_word_embeddings=False),
        Qwen3Config(**SMALL, head_dim=16, tie_word_embeddings=True),  # QK-norm, head_dim != h/n
        LlamaConfig(**SMALL, tie_word_embeddings=False),
        Qwen3MoeConfig(
            **SMALL,
            head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            tie_word_embeddings=False,
        ),  # fmt: skip
    ],
    ids=["qwen2-tied", "qwen2", "qwen3", "llama", "qwen3-moe"],
)
@pytest.mark.parametrize("tp", [1, 2])
def test_round_trip_through_megatron_shards_is_bit_equal(config, tp):
    hf, _ = _hf_state(config)
    shape = shape_from_hf(config)
    full = hf_to_megatron(hf, shape)
    shards = {name: tp_split(name, t, tp) for name, t in full.items()}
    merged = {name: tp_merge(name, s) for name, s in shards.items()}
    back = megatron_to_hf(merged, shape)
    if shape.tied and "lm_head.weight" in hf:  # a loaded model repeats the embedding there
        assert torch.equal(hf.pop("lm_head.weight"), hf["model.embed_tokens.weight"])
    assert back.keys() == hf.keys()
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name
    # the Megatron side has what GPTModel's local spec names, nothing more: per layer two
    # norms, QKV, the output projection and the MLP (fc1 and fc2, or a router and each
    # expert's fc1 and fc2)
    mlp = 1 + 2 * shape.experts if shape.experts else 2
    per_layer = 4 + mlp + shape.qkv_bias + 2 * shape.qk_norm
    expected = 2 + shape.num_layers * per_layer + (not shape.tied)
    assert len(full) == expected


def test_unsupported_features_are_named():
    with pytest.raises(NotImplementedError, match="rope_type='llama3'"):
        shape_from_hf(
            LlamaConfig(
                **SMALL,
                rope_parameters={
                    "rope_type": "llama3",
                    "rope_theta": 1e4,
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 32,
                },
            )
        )
    with pytest.raises(NotImplementedError, match="attention_bias"):
        shape_from_hf(LlamaConfig(**SMALL, attention_bias=True))
    with pytest.raises(NotImplementedError, match="dense layers between the MoE layers"):
        shape_from_hf(Qwen3MoeConfig(**SMALL, num_experts=4, mlp_only_layers=[0]))
    from transformers import GPT2Config

    with pytest.raises(NotImplementedError, match="gpt2"):
        shape_from_hf(GPT2Config())


def test_unknown_hf_tensors_are_refused():
    config = Qwen2Config(**SMALL)
    hf, _ = _hf_state(config)
    hf["model.layers.0.mlp.extra.weight"] = torch.zeros(1)
    with pytest.raises(KeyError, match="extra"):
        hf_to_megatron(hf, shape_from_hf(config))
