"""Tiny random-weight vision-language models, built locally like ``rlpost.archs``.

A VL directory holds what a hub checkpoint holds: the model, the tokenizer
(``rlpost.archs``' byte-level BPE plus the model's image tokens) with a chat
template that renders image parts, and the processor that turns an image into
``pixel_values`` and expands its placeholder into one token per merged patch.
Images are small (56x56 pixels: 4 image tokens) so that two CPU cores train on
them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlpost.archs import INIT_STD, build_tokenizer
from trainers.files import atomic_directory

IMAGE_SIDE = 56  # pixels; 14-pixel patches merged 2x2 give 4 image tokens

# ChatML whose content may be a list of parts: {"type": "text", "text": ...}
# or {"type": "image"} (where the processor puts the image's tokens).
QWEN_VL_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for part in m['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QWEN_VL_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
TEXT = dict(
    hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=1024, initializer_range=INIT_STD,
)  # fmt: skip


def _qwen_tokenizer() -> Any:
    tok = build_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": QWEN_VL_TOKENS})
    tok.chat_template = QWEN_VL_TEMPLATE
    return tok


def _token_ids(tok: Any) -> dict[str, Any]:
    ids = {name: tok.convert_tokens_to_ids(name) for name in QWEN_VL_TOKENS}
    return dict(
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )  # fmt: skip


def _vocab(tok: Any) -> int:
    return (len(tok) + 63) // 64 * 64  # every token id has an embedding row


def _qwen2_vl(tok: Any) -> tuple[Any, Any]:
    import transformers as T

    text = dict(
        **TEXT, vocab_size=_vocab(tok), bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        # head_dim 64: the rotary halves split over (time, height, width)
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [8, 12, 12]},
    )  # fmt: skip
    config = T.Qwen2VLConfig(
        text_config=text,
        vision_config=dict(
            depth=2, embed_dim=64, hidden_size=TEXT["hidden_size"], num_heads=2, mlp_ratio=2,
            patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
            initializer_range=INIT_STD,
        ),
        tie_word_embeddings=False,
        **_token_ids(tok),
    )  # fmt: skip
    pixels = IMAGE_SIDE * IMAGE_SIDE
    images = T.Qwen2VLImageProcessor(min_pixels=pixels, max_pixels=pixels)
    processor = T.Qwen2VLProcessor(
        image_processor=images, tokenizer=tok, video_processor=None,
        chat_template=QWEN_VL_TEMPLATE,
    )  # fmt: skip
    return config, processor


# transformers class name -> (tokenizer builder, config-and-processor builder)
VL_ARCHS: dict[str, tuple[Callable[[], Any], Callable[[Any], tuple[Any, Any]]]] = {
    "Qwen2VLForConditionalGeneration": (_qwen_tokenizer, _qwen2_vl),
}


def build_vl_model(arch: str, out_dir: str | Path, seed: int = 0) -> Path:
    """Write a random-weight tiny VL ``arch`` model, its tokenizer and processor to
    ``out_dir`` (atomically; an existing directory is replaced)."""
    from rlpost.vl.compat import NoVideo, install

    install()
    import transformers

    if arch not in VL_ARCHS:
        raise ValueError(f"unknown VL architecture {arch!r}; choose one of {', '.join(VL_ARCHS)}")
    make_tokenizer, make = VL_ARCHS[arch]
    tok = make_tokenizer()
    config, processor = make(tok)
    config.architectures = [arch]
    torch.manual_seed(seed)
    model = getattr(transformers, arch)(config).float()
    if getattr(processor, "video_processor", NoVideo()) is None:
        processor.video_processor = NoVideo()  # saved as an empty part, loaded as one
    with atomic_directory(out_dir) as tmp:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    return Path(out_dir)
