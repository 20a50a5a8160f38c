"""Tiny models of every supported architecture (rlpost.models.archs): tokenizer, configs, weights.

The integration matrix (tests/integration/test_model_matrix.py) sends these
through the whole loop; here each piece is checked on its own, cheaply.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from rlpost.models.archs import (
    ARCHS,
    GEMMA_SLIDING_WINDOW,
    VOCAB_SIZE,
    build_arch_model,
    build_config,
    build_tokenizer,
    is_gemma,
)

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Reverse: the quick brown fox."},
]


@pytest.fixture(scope="module")
def chatml():
    return build_tokenizer()


@pytest.fixture(scope="module")
def gemma():
    return build_tokenizer(gemma=True)


def test_tokenizer_round_trips_any_text_and_fills_the_vocabulary(chatml):
    text = "Hello, wörld! 123 + 4 = 127?\n\tdef f(x):  return x  # émoji 🙂"
    ids = chatml(text, add_special_tokens=False)["input_ids"]
    assert chatml.decode(ids) == text
    # Merges learnt on the corpus: common words take fewer tokens than bytes.
    assert len(chatml("the quick brown fox")["input_ids"]) < len("the quick brown fox") / 2
    assert len(chatml) == VOCAB_SIZE
    # Every id a model can sample decodes to something (reserved ids included).
    assert all(chatml.convert_ids_to_tokens(i) is not None for i in range(VOCAB_SIZE))


def test_chat_templates_render_chatml_and_gemma_turns(chatml, gemma):
    assert chatml.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nReverse: the quick brown fox.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert chatml.eos_token == "<|im_end|>" and chatml.pad_token == "<|pad|>"
    reply = [*CHAT[1:], {"role": "assistant", "content": "eht"}]
    assert gemma.apply_chat_template(reply, tokenize=False) == (
        "<bos><start_of_turn>user\nReverse: the quick brown fox.<end_of_turn>\n"
        "<start_of_turn>model\neht<end_of_turn>\n"
    )
    assert (gemma.bos_token, gemma.eos_token) == ("<bos>", "<end_of_turn>")
    # Special tokens are single ids, never split by BPE.
    ids = gemma("<start_of_turn>model\n", add_special_tokens=False)["input_ids"]
    assert ids[0] == gemma.convert_tokens_to_ids("<start_of_turn>")


@pytest.mark.parametrize("arch", list(ARCHS))
def test_saved_tokenizer_reloads_the_same_beside_each_config(arch, tmp_path):
    """AutoTokenizer (as rlpost and vLLM load it) may rebuild the tokenizer from the
    config's model type (qwen2 -> Qwen2Tokenizer): it must still encode alike."""
    tokenizer = build_tokenizer(gemma=is_gemma(arch))
    build_config(arch, tokenizer).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    text += "don't  stop\n\n  123 ünïcode"
    assert (
        loaded(text, add_special_tokens=False)["input_ids"]
        == tokenizer(text, add_special_tokens=False)["input_ids"]
    )
    assert (loaded.eos_token_id, loaded.pad_token_id) == (
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
    )


@pytest.mark.parametrize("arch", list(ARCHS))
def test_configs_have_the_shapes_the_engines_accept(arch, chatml):
    config = build_config(arch, chatml)
    assert config.architectures == [arch]
    assert config.num_hidden_layers == 2 and config.hidden_size == 256
    assert config.vocab_size == VOCAB_SIZE
    assert config.eos_token_id == chatml.eos_token_id
    if arch.startswith("Deepseek"):
        # vLLM's CPU MLA kernel: a 512-wide latent KV plus a 64-wide rotary part.
        assert (config.kv_lora_rank, config.qk_rope_head_dim) == (512, 64)
    else:
        head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        assert head_dim == 64  # vLLM's CPU attention refuses 16


def test_deepseek_v3_routes_as_transformers_does(chatml):
    config = build_config("DeepseekV3ForCausalLM", chatml)
    # vLLM reads these; transformers always uses sigmoid scores and a bias correction.
    assert (config.topk_method, config.scoring_func) == ("noaux_tc", "sigmoid")


@pytest.mark.parametrize("arch", ["Gemma2ForCausalLM", "Gemma3ForCausalLM"])
def test_gemma_sliding_window_is_shorter_than_a_chat_prompt(arch, gemma):
    config = build_config(arch, gemma)
    assert config.sliding_window == GEMMA_SLIDING_WINDOW
    assert "sliding_attention" in config.layer_types and "full_attention" in config.layer_types
    prompt = gemma.apply_chat_template(CHAT[1:], tokenize=False, add_generation_prompt=True)
    assert len(gemma(prompt, add_special_tokens=False)["input_ids"]) > GEMMA_SLIDING_WINDOW


@pytest.mark.parametrize("arch", list(ARCHS))
def test_saved_model_loads_as_its_class_with_peaked_but_not_degenerate_predictions(arch, tmp_path):
    out = build_arch_model(arch, tmp_path / "model", seed=0)
    assert AutoConfig.from_pretrained(out).architectures == [arch]
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert type(model).__name__ == arch
    tokenizer = AutoTokenizer.from_pretrained(out)
    text = tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        logp_tv = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    entropy_t = -(logp_tv.exp() * logp_tv).sum(-1)
    # Far from uniform (log 512 = 6.24 nats), yet sampling still varies (GRPO
    # needs groups whose samples differ).
    assert 2.0 < float(entropy_t.mean()) < math.log(VOCAB_SIZE) - 0.5
    # Same seed, same weights.
    again = build_arch_model(arch, tmp_path / "again", seed=0)
    a = AutoModelForCausalLM.from_pretrained(again, dtype=torch.float32)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), a.parameters()))


def test_command_line_writes_a_model_directory(tmp_path, capsys):
    from rlpost.models.archs import main

    assert main(["Phi3ForCausalLM", str(tmp_path / "phi3")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "phi3")
    assert AutoConfig.from_pretrained(tmp_path / "phi3").architectures == ["Phi3ForCausalLM"]
