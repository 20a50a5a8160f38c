"""What ``model.lora.target_modules=all-linear`` adapts: the language model's
``nn.Linear`` layers, never the head or a MoE model's fused expert tensors, and
PEFT adapts exactly the names it is given."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlpost.models.archs import build_config, build_tokenizer
from rlpost.trainers.fsdp.lora import (
    LoraSettings,
    all_linear_targets,
    apply_lora,
    merged_hf_weights,
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def _model(arch: str, tokenizer) -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(build_config(arch, tokenizer), dtype=torch.float32)


def test_dense_model_gets_short_names(tokenizer):
    model = _model("Qwen2ForCausalLM", tokenizer)
    expected = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    assert all_linear_targets(model) == expected


def test_moe_model_keeps_its_dense_mlps_and_leaves_the_experts(tokenizer):
    model = _model("DeepseekV2ForCausalLM", tokenizer)
    targets = all_linear_targets(model)
    # 'down_proj' also names the fused expert tensor experts.down_proj: full names
    assert "model.layers.0.mlp.down_proj" in targets  # the dense first layer
    assert "model.layers.1.mlp.shared_experts.up_proj" in targets
    assert not any("experts." in t and "shared_experts" not in t for t in targets)
    assert "lm_head" not in " ".join(targets)

    peft = apply_lora(model, LoraSettings(rank=4), "unused")
    adapted = sorted(n for n, m in peft.named_modules() if hasattr(m, "lora_A"))
    assert [n.removeprefix("base_model.model.") for n in adapted] == sorted(targets)
    assert not peft.peft_config["default"].target_parameters
    # every adapter folds into a plain HF weight of the same name (a merged sync)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if ".lora_B." in name:
                p.fill_(0.01)
    state = {k: v.detach().clone() for k, v in peft.state_dict().items()}
    merged = merged_hf_weights(state, LoraSettings(rank=4))
    reference = peft.merge_and_unload().state_dict()
    assert merged.keys() == reference.keys()
    assert max(float((merged[k] - reference[k]).abs().max()) for k in merged) == 0.0


def test_moe_model_with_experts_only_adapts_attention(tokenizer):
    model = _model("Qwen3MoeForCausalLM", tokenizer)
    assert all_linear_targets(model) == ["k_proj", "o_proj", "q_proj", "v_proj"]
