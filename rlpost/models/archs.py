"""Tiny random-weight models of the text architectures rlpost supports, built locally.

``build_arch_model("Gemma2ForCausalLM", out_dir)`` writes a directory that
``model.path=<out_dir>`` takes like any hub checkpoint: a two-layer model of
that transformers class (hidden 256, head_dim 64) with random weights, and a
byte-level BPE tokenizer trained here on a small built-in corpus, with a chat
template. Nothing is downloaded. ``python -m rlpost.support`` sends each of
these through the whole loop to produce ``SUPPORT.md``;
``python -m rlpost.models.archs ARCH OUT_DIR`` writes one.

Shapes are the smallest that every engine accepts: vLLM's CPU attention
refuses head_dim 16 (32 and 64 work) and its CPU MLA kernel (DeepSeek) needs
``kv_lora_rank=512`` and ``qk_rope_head_dim=64``. Weights are drawn with std
0.1 rather than transformers' 0.02, so that an untrained model's next-token
distribution is far from uniform and log-prob comparisons mean something
(Gemma, whose embeddings are scaled up, gets 0.05).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    PretrainedConfig,
    PreTrainedTokenizerFast,
)

from rlpost.trainers.files import atomic_directory

VOCAB_SIZE = 512  # model vocabulary; the tokenizer is padded to exactly this many tokens
INIT_STD = 0.1

# Every architecture shares these; a builder adds or removes what its config needs.
# Typed loosely: they are keyword arguments of transformers config classes of many types.
SHAPE: dict[str, Any] = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=1024,
    initializer_range=INIT_STD,
)
# Gemma's sliding window, kept below a chat prompt plus its completion so that
# the windowed layers really drop the start of the sequence.
GEMMA_SLIDING_WINDOW = 16
# Gemma scales its (tied) embeddings by sqrt(hidden) = 16: at std 0.1 one token
# takes nearly all the probability everywhere, and GRPO groups would agree.
GEMMA_INIT_STD = 0.05

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Gemma's layout: a leading <bos>, turns of "user" and "model", <end_of_turn> ends a turn.
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] }}"
    "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>",
    "<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>",
]  # fmt: skip
# Qwen2's pre-tokenizer split. transformers rebuilds a tokenizer saved beside a
# qwen2/qwen3 config as ``Qwen2Tokenizer`` (this split, NFC); using the same
# pipeline for every architecture makes the reloaded tokenizer encode alike.
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, this is a tiny tokenizer for testing models.",
    "You are a helpful assistant. Answer the question briefly.",
    "What is the capital of France? Paris is the capital of France.",
    "Reinforcement learning trains a policy with rewards from its own samples.",
    "One two three four five six seven eight nine ten eleven twelve.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024; symbols + - * / = ( ) ? ! . , : ;",
    "Reverse the letters of each word, then count the vowels in the sentence.",
    "The model reads the prompt and writes an answer; the reward scores the answer.",
    "Sort these words: apple, banana, cherry, date, elderberry, fig, grape.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "A red square, a blue circle and a green triangle lie on a white table.",
]


def build_tokenizer(gemma: bool = False) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on ``CORPUS``, padded with reserved tokens to ``VOCAB_SIZE``.

    ChatML turns (``<|im_start|>`` ... ``<|im_end|>``, eos ``<|im_end|>``) by
    default; ``gemma=True`` gives Gemma's (bos ``<bos>``, eos ``<end_of_turn>``).
    Any text round-trips: ``decode(encode(s)) == s`` (NFC-normalised s). Every
    id below ``VOCAB_SIZE`` decodes, so whatever a random model samples has text.
    """
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - 32,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    reserved = [f"<|reserved_{i}|>" for i in range(VOCAB_SIZE - tok.get_vocab_size())]
    tok.add_special_tokens(reserved)
    if gemma:
        names = dict(bos_token="<bos>", eos_token="<end_of_turn>", pad_token="<pad>")
        template = GEMMA_TEMPLATE
    else:
        names = dict(bos_token="<|endoftext|>", eos_token="<|im_end|>", pad_token="<|pad|>")
        template = CHATML_TEMPLATE
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        chat_template=template,
        clean_up_tokenization_spaces=False,
        model_max_length=SHAPE["max_position_embeddings"],
        **names,
    )
    assert len(hf) == VOCAB_SIZE, len(hf)
    return hf


def _ids(tok: PreTrainedTokenizerFast) -> dict[str, Any]:
    return dict(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )


def _shape(*drop: str, **extra: object) -> dict[str, Any]:
    out = {k: v for k, v in SHAPE.items() if k not in drop}
    out.update(extra)
    return out


def _qwen2(tok):
    from transformers import Qwen2Config

    return Qwen2Config(**_shape(), **_ids(tok), tie_word_embeddings=False)


def _qwen3(tok):
    from transformers import Qwen3Config

    return Qwen3Config(**_shape(), **_ids(tok), tie_word_embeddings=True)


def _qwen3_moe(tok):
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        **_shape(), **_ids(tok), num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=128, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
    )  # fmt: skip


def _llama(tok):
    from transformers import LlamaConfig

    return LlamaConfig(**_shape(), **_ids(tok))


def _mistral(tok):
    from transformers import MistralConfig

    return MistralConfig(**_shape(), **_ids(tok), sliding_window=None)


def _mixtral(tok):
    from transformers import MixtralConfig

    return MixtralConfig(
        **_shape(), **_ids(tok), num_local_experts=4, num_experts_per_tok=2, sliding_window=None
    )


def _gemma2(tok):
    from transformers import Gemma2Config

    # Two layers: one sliding-window, one global (Gemma 2 alternates them).
    return Gemma2Config(
        **_shape(initializer_range=GEMMA_INIT_STD), **_ids(tok), query_pre_attn_scalar=64, sliding_window=GEMMA_SLIDING_WINDOW,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
    )  # fmt: skip


def _gemma3(tok):
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        **_shape(initializer_range=GEMMA_INIT_STD), **_ids(tok), query_pre_attn_scalar=64, sliding_window=GEMMA_SLIDING_WINDOW,
        layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip


def _glm4(tok):
    from transformers import Glm4Config

    return Glm4Config(**_shape(), **_ids(tok))


def _glm(tok):
    from transformers import GlmConfig

    return GlmConfig(**_shape(), **_ids(tok))


def _deepseek(tok) -> dict[str, Any]:
    # Multi-head latent attention; the CPU MLA kernel takes kv_lora_rank 512 with a
    # 64-wide rotary part. Layer 0 dense, layer 1 mixture-of-experts.
    return _shape(
        "head_dim", num_key_value_heads=4, moe_intermediate_size=128, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=512,
        qk_rope_head_dim=64, qk_nope_head_dim=64, v_head_dim=64, routed_scaling_factor=1.0,
        n_group=1, topk_group=1, **_ids(tok),
    )  # fmt: skip


def _deepseek_v2(tok):
    from transformers import DeepseekV2Config

    return DeepseekV2Config(
        **_deepseek(tok), q_lora_rank=None, topk_method="greedy", norm_topk_prob=False
    )


def _deepseek_v3(tok):
    from transformers import DeepseekV3Config

    # transformers' V3 always routes with sigmoid scores and a correction bias;
    # vLLM reads both choices from the config (real V3 checkpoints carry them):
    # without topk_method="noaux_tc" it has no e_score_correction_bias to load.
    routing: dict[str, Any] = {"topk_method": "noaux_tc", "scoring_func": "sigmoid"}
    return DeepseekV3Config(**_deepseek(tok), q_lora_rank=128, norm_topk_prob=True, **routing)


def _phi3(tok):
    from transformers import Phi3Config

    return Phi3Config(**_shape("head_dim"), **_ids(tok))  # head_dim = hidden / heads = 64


# transformers class name -> config builder. Names are what ``config.json`` lists
# under "architectures" and what SUPPORT.md's rows are named by.
ARCHS: dict[str, Callable[[PreTrainedTokenizerFast], PretrainedConfig]] = {
    "Qwen2ForCausalLM": _qwen2,
    "Qwen3ForCausalLM": _qwen3,
    "Qwen3MoeForCausalLM": _qwen3_moe,
    "LlamaForCausalLM": _llama,
    "MistralForCausalLM": _mistral,
    "MixtralForCausalLM": _mixtral,
    "Gemma2ForCausalLM": _gemma2,
    "Gemma3ForCausalLM": _gemma3,
    "Glm4ForCausalLM": _glm4,
    "GlmForCausalLM": _glm,
    "DeepseekV2ForCausalLM": _deepseek_v2,
    "DeepseekV3ForCausalLM": _deepseek_v3,
    "Phi3ForCausalLM": _phi3,
}


def check_arch(arch: str) -> None:
    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; choose one of {', '.join(ARCHS)}")


def is_gemma(arch: str) -> bool:
    return arch.startswith("Gemma")


def build_config(arch: str, tokenizer: PreTrainedTokenizerFast) -> PretrainedConfig:
    """The tiny config of ``arch`` with ``tokenizer``'s special-token ids."""
    check_arch(arch)
    config = ARCHS[arch](tokenizer)
    config.architectures = [arch]
    config.dtype = "float32"
    return config


def build_arch_model(arch: str, out_dir: str | Path, seed: int = 0) -> Path:
    """Write a random-weight tiny ``arch`` model and its tokenizer to ``out_dir``.

    The directory appears atomically (written to a temporary sibling, then
    renamed); an existing ``out_dir`` is replaced.
    """
    tokenizer = build_tokenizer(gemma=is_gemma(arch))
    config = build_config(arch, tokenizer)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(**_ids(tokenizer))
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with atomic_directory(out_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m rlpost.models.archs",
        description="Write a tiny random-weight model directory.",
    )
    parser.add_argument("arch", choices=list(ARCHS), help="transformers class")
    parser.add_argument("out_dir", help="directory to write (replaced if it exists)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(build_arch_model(args.arch, args.out_dir, args.seed))
    return 0


__all__ = [
    "ARCHS",
    "CHATML_TEMPLATE",
    "GEMMA_TEMPLATE",
    "build_arch_model",
    "build_config",
    "build_tokenizer",
]


if __name__ == "__main__":
    import sys

    sys.exit(main())
