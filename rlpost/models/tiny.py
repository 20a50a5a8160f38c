"""Tiny Qwen2 models with a character-level tokenizer, built locally.

Nothing is downloaded: the tokenizer is assembled with the ``tokenizers``
library and the model gets random weights from a ``Qwen2Config``. Both are
written with ``save_pretrained`` so transformers and vLLM load them like any
hub checkpoint. Used by the tests and by the built-in arithmetic task.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import AddedToken
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode
from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

from rlpost.models.positions import TEXT_POSITIONS
from rlpost.trainers.files import atomic_directory

PAD = "<|pad|>"
USER = "<|user|>"
ASSISTANT = "<|assistant|>"
SYSTEM = "<|system|>"
EOS = "<|end|>"
SPECIAL_TOKENS = [PAD, USER, ASSISTANT, SYSTEM, EOS]
# Printable ASCII (space .. ~) and newline, in byte-level BPE spelling
# (space is "Ġ", newline "Ċ"). ASCII only, so every token is a whole UTF-8
# character: a detokenizer never has to hold back a partial character, and
# vLLM's streamed text equals ``tokenizer.decode(ids)`` for any sampled ids.
CHARS = [chr(c) for c in range(ord(" "), ord("~") + 1)] + ["\n"]
# Reserved tokens pad the vocabulary to a multiple of 8, the multiple the
# embedding is padded to, so that every id the model can emit decodes.
VOCAB_MULTIPLE = 8

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

# Head dims must be one vLLM's CPU attention supports (32, 64, 80, ...).
TINY_PRESETS: dict[str, dict] = {
    # ~1.0 M parameters: the default policy for the built-in task.
    "tiny": dict(
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=512,
    ),
    # ~30 M parameters: a realistic compute per token for performance work, where
    # generation engines and trainer overheads show (model=small).
    "small": dict(
        hidden_size=512,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        intermediate_size=2048,
    ),
    # ~0.1 M parameters: for fast tests.
    "micro": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=128,
    ),
}


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer: one token per character, exact round trip.

    ``decode(encode(s)) == s`` for any string of printable ASCII and newlines
    (spaces included). Other characters have no token and are dropped by
    ``encode``: the tiny models are for ASCII tasks. Special tokens
    (``<|user|>``, ``<|end|>`` ...) are matched whole, ``len(tokenizer)`` is
    a multiple of 8 and there is no BOS.

    It is a ``Qwen2Tokenizer`` (byte-level BPE) with an empty merge list
    because ``AutoTokenizer`` (and so vLLM) rebuilds any tokenizer saved next
    to a ``qwen2`` config as ``Qwen2Tokenizer`` from its vocab and merges; a
    tokenizer built any other way would change behaviour on reload.
    """
    byte_to_char = bytes_to_unicode()
    char_tokens = [byte_to_char[ord(c)] for c in CHARS]
    tokens = SPECIAL_TOKENS + char_tokens
    tokens += [f"<|reserved_{i}|>" for i in range(-len(tokens) % VOCAB_MULTIPLE)]
    tokenizer = Qwen2Tokenizer(
        vocab={t: i for i, t in enumerate(tokens)},
        merges=[],
        unk_token=None,  # type: ignore[arg-type]  # no UNK: unknown chars are dropped
        eos_token=EOS,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=TEXT_POSITIONS,
    )
    specials = [t for t in tokens if t not in char_tokens]
    tokenizer.add_tokens(
        [AddedToken(t, special=True, normalized=False) for t in specials], special_tokens=True
    )
    assert len(tokenizer) == len(tokens), "special tokens must reuse their vocab ids"
    return tokenizer


def build_config(preset: str, tokenizer: PreTrainedTokenizerFast) -> Qwen2Config:
    """Qwen2 config for ``preset`` with the vocabulary of ``tokenizer``."""
    if preset not in TINY_PRESETS:
        raise ValueError(f"unknown tiny preset {preset!r}; choose one of {sorted(TINY_PRESETS)}")
    vocab_size = -(-len(tokenizer) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    return Qwen2Config(
        vocab_size=vocab_size,
        max_position_embeddings=TEXT_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
        **TINY_PRESETS[preset],
    )


def build_tiny_model(
    preset: str, out_dir: str | Path, seed: int, init_std: float | None = None
) -> Path:
    """Write a random-weight tiny Qwen2 model and its tokenizer to ``out_dir``.

    ``init_std`` overrides the weight init (``initializer_range``, 0.02 by
    default). Parity tests use a larger value: at 0.02 the tied embeddings
    make an untrained model repeat its last input token, which would not
    exercise sampling or detokenization.

    The directory appears atomically: everything is written to a temporary
    sibling which is then renamed, so a crash never leaves a half-written
    model that a later run would load. An existing ``out_dir`` is replaced.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    config = build_config(preset, tokenizer)
    if init_std is not None:
        config.initializer_range = init_std
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).float()
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    with atomic_directory(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "tiny_preset.json").write_text(json.dumps({"preset": preset, "seed": seed}))
    return out_dir


def build_tiny_reward_model(preset: str, out_dir: str | Path, seed: int) -> Path:
    """A random-weight tiny reward model (``Qwen2ForSequenceClassification``, one
    label) and the built-in tokenizer with its chat template, for tests and quick
    checks of ``reward.model.path``; written atomically like ``build_tiny_model``."""
    from transformers import Qwen2ForSequenceClassification

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    config = build_config(preset, tokenizer)
    config.num_labels = 1
    torch.manual_seed(seed)
    model = Qwen2ForSequenceClassification(config).float()
    with atomic_directory(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    return out_dir


def num_parameters(preset: str) -> int:
    """Parameter count of ``preset`` (tied embeddings counted once)."""
    config = build_config(preset, build_tokenizer())
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    return sum(p.numel() for p in model.parameters())


__all__ = [
    "CHAT_TEMPLATE",
    "EOS",
    "TINY_PRESETS",
    "build_config",
    "build_tiny_model",
    "build_tiny_reward_model",
    "build_tokenizer",
    "num_parameters",
]
