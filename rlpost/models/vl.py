"""Tiny random-weight vision-language models, built locally like ``rlpost.models.archs``.

A VL directory holds what a hub checkpoint holds: the model, the tokenizer
(``rlpost.models.archs``' byte-level BPE plus the model's image tokens) with a chat
template that renders image parts, and the processor that turns an image into
``pixel_values`` and expands its placeholder into the image's tokens.

    python -m rlpost.models.vl LlavaForConditionalGeneration /tmp/tiny-llava

Every model has a two-layer language model (hidden 256, head_dim 64, as
``rlpost.models.archs``) and a two-layer vision tower of width 64. Images are small so
that two CPU cores train on them: 56x56 pixels (64x64 for Qwen3-VL, whose
patches are 16 pixels), which the processor resizes any input image to, give
4 image tokens (16 for LLaVA, one per patch). Weights that transformers starts
at zero (Gemma 3's projector) are drawn at random like the rest, or the image
would not reach the language model at all.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rlpost.models.archs import GEMMA_INIT_STD, GEMMA_SLIDING_WINDOW, INIT_STD, build_tokenizer
from rlpost.models.positions import VL_TEXT_POSITIONS
from rlpost.trainers.files import atomic_directory

if TYPE_CHECKING:
    from transformers import (
        PretrainedConfig,
        PreTrainedTokenizerFast,
        ProcessorMixin,
        Qwen2VLImageProcessor,
    )

    # what a VL builder returns: the tokenizer, the model's config and its processor
    VLParts = tuple[PreTrainedTokenizerFast, PretrainedConfig, ProcessorMixin]

IMAGE_SIDE = 56  # pixels; 14-pixel patches merged 2x2 give 4 image tokens

TEXT = dict(
    hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=VL_TEXT_POSITIONS, initializer_range=INIT_STD,
)  # fmt: skip
# A two-layer vision tower of width 64 (CLIP, SigLIP and InternViT configs).
TOWER = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
    initializer_range=INIT_STD,
)  # fmt: skip


def chat_template(image: str, gemma: bool = False) -> str:
    """ChatML (Gemma's turns with ``gemma=True``) whose content may be a list of parts:
    ``{"type": "text", "text": ...}`` or ``{"type": "image"}``, rendered as ``image``
    (the placeholder the processor and vLLM expand into the image's tokens)."""
    content = (
        "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
        "{% for part in m['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
        f"{{% elif part['type'] == 'image' %}}{image}"
        "{% endif %}{% endfor %}{% endif %}"
    )
    if gemma:
        return (
            "{{ bos_token }}{% for m in messages %}<start_of_turn>"
            "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
            + content
            + "<end_of_turn>\n"
            "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
        )
    return (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n" + content + "<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


def vl_tokenizer(
    tokens: list[str],
    named: dict[str, str] | None = None,
    template: str = "",
    gemma: bool = False,
    plain: tuple[str, ...] = (),
) -> PreTrainedTokenizerFast:
    """``rlpost.models.archs``' tokenizer plus special ``tokens``, of which ``named`` are also
    attributes (``tokenizer.image_token``, ... as processors look them up), and
    ``plain`` tokens that are not special."""
    from transformers import PreTrainedTokenizerFast

    base = build_tokenizer(gemma=gemma)
    base.add_special_tokens({"additional_special_tokens": tokens})
    if plain:
        base.add_tokens(list(plain))
    if not named:
        base.chat_template = template
        return base
    return PreTrainedTokenizerFast(
        tokenizer_object=base.backend_tokenizer,
        bos_token=base.bos_token, eos_token=base.eos_token, pad_token=base.pad_token,
        chat_template=template, clean_up_tokenization_spaces=False,
        model_max_length=base.model_max_length, extra_special_tokens=named,
    )  # fmt: skip


def _text(tok: PreTrainedTokenizerFast, **extra: object) -> dict[str, object]:
    """The language model's config: ``TEXT`` with the tokenizer's vocabulary and ids."""
    vocab = (len(tok) + 63) // 64 * 64  # every token id has an embedding row
    ids = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    return {**TEXT, "vocab_size": vocab, "pad_token_id": tok.pad_token_id, **ids, **extra}


def _id(tok: PreTrainedTokenizerFast, token: str) -> int:
    found = tok.convert_tokens_to_ids(token)
    assert isinstance(found, int)  # one token: one id
    return found


# -- Qwen2-VL, Qwen2.5-VL, Qwen3-VL -----------------------------------------------
QWEN_VL_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
QWEN_VL_TEMPLATE = chat_template("<|vision_start|><|image_pad|><|vision_end|>")


def _qwen_ids(tok: PreTrainedTokenizerFast) -> dict[str, Any]:  # a transformers config's kwargs
    return dict(
        image_token_id=_id(tok, "<|image_pad|>"), video_token_id=_id(tok, "<|video_pad|>"),
        vision_start_token_id=_id(tok, "<|vision_start|>"),
        vision_end_token_id=_id(tok, "<|vision_end|>"), tie_word_embeddings=False,
    )  # fmt: skip


def _qwen_images(side: int, patch: int, **kwargs: Any) -> Qwen2VLImageProcessor:
    """Qwen's image processor, resizing every image to ``side`` x ``side`` pixels;
    ``kwargs`` are more of its own arguments."""
    import transformers as T

    pixels = side * side
    return T.Qwen2VLImageProcessor(
        min_pixels=pixels, max_pixels=pixels, patch_size=patch, merge_size=2,
        temporal_patch_size=2, **kwargs,
    )  # fmt: skip


# Qwen2-VL and Qwen2.5-VL's multimodal rotary embedding; head_dim 64: the rotary
# halves split over (time, height, width).
QWEN_MROPE = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [8, 12, 12]}


def _qwen2_vl() -> VLParts:
    import transformers as T

    tok = vl_tokenizer(QWEN_VL_TOKENS, template=QWEN_VL_TEMPLATE)
    config = T.Qwen2VLConfig(
        text_config=_text(tok, rope_parameters=copy.deepcopy(QWEN_MROPE)),
        vision_config=dict(
            depth=2, embed_dim=64, hidden_size=TEXT["hidden_size"], num_heads=2, mlp_ratio=2,
            patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
            initializer_range=INIT_STD,
        ),
        **_qwen_ids(tok),
    )  # fmt: skip
    processor = T.Qwen2VLProcessor(
        image_processor=_qwen_images(IMAGE_SIDE, 14), tokenizer=tok, video_processor=None,
        chat_template=QWEN_VL_TEMPLATE,
    )  # fmt: skip
    return tok, config, processor


def _qwen2_5_vl() -> VLParts:
    import transformers as T

    tok = vl_tokenizer(QWEN_VL_TOKENS, template=QWEN_VL_TEMPLATE)
    config = T.Qwen2_5_VLConfig(
        text_config=_text(tok, rope_parameters=copy.deepcopy(QWEN_MROPE)),
        # Windowed attention in block 0 (one 56-pixel window: the whole image), full in 1.
        vision_config=dict(
            depth=2, hidden_size=64, intermediate_size=128, num_heads=2,
            out_hidden_size=TEXT["hidden_size"], patch_size=14, spatial_merge_size=2,
            temporal_patch_size=2, window_size=IMAGE_SIDE, fullatt_block_indexes=[1],
            initializer_range=INIT_STD,
        ),
        **_qwen_ids(tok),
    )  # fmt: skip
    processor = T.Qwen2_5_VLProcessor(
        image_processor=_qwen_images(IMAGE_SIDE, 14), tokenizer=tok, video_processor=None,
        chat_template=QWEN_VL_TEMPLATE,
    )  # fmt: skip
    return tok, config, processor


QWEN3_VL_SIDE = 64  # 16-pixel patches merged 2x2: 4 image tokens


def _qwen3_vl() -> VLParts:
    import transformers as T

    tok = vl_tokenizer(QWEN_VL_TOKENS, template=QWEN_VL_TEMPLATE)
    rope = {
        "rope_type": "default", "rope_theta": 5e6, "mrope_section": [12, 10, 10],
        "mrope_interleaved": True,
    }  # fmt: skip
    config = T.Qwen3VLConfig(
        text_config=_text(tok, head_dim=64, rope_parameters=rope),
        # deepstack: block 0's features are also added to the language model's first layer
        vision_config=dict(
            depth=2, hidden_size=64, intermediate_size=128, num_heads=2,
            out_hidden_size=TEXT["hidden_size"], patch_size=16, spatial_merge_size=2,
            temporal_patch_size=2, num_position_embeddings=64, deepstack_visual_indexes=[0],
            initializer_range=INIT_STD,
        ),
        **_qwen_ids(tok),
    )  # fmt: skip
    images = _qwen_images(QWEN3_VL_SIDE, 16, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    processor = T.Qwen3VLProcessor(
        image_processor=images, tokenizer=tok, video_processor=None,
        chat_template=QWEN_VL_TEMPLATE,
    )  # fmt: skip
    return tok, config, processor


# -- InternVL, LLaVA, Gemma 3 ------------------------------------------------------
def _internvl() -> VLParts:
    import transformers as T

    named = {
        "start_image_token": "<img>", "end_image_token": "</img>",
        "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>",
    }  # fmt: skip
    # The processor expands <IMG_CONTEXT> into <img>, 4 x <IMG_CONTEXT>, </img>.
    template = chat_template("<IMG_CONTEXT>")
    tok = vl_tokenizer(list(named.values()), named, template)
    side = [IMAGE_SIDE, IMAGE_SIDE]
    config = T.InternVLConfig(
        vision_config=dict(**TOWER, image_size=side, patch_size=[14, 14]),
        text_config=dict(model_type="qwen2", **_text(tok)),
        image_token_id=_id(tok, "<IMG_CONTEXT>"), image_seq_length=4, downsample_ratio=0.5,
        vision_feature_layer=-1, vision_feature_select_strategy="default",
    )  # fmt: skip
    images = T.GotOcr2ImageProcessor(
        size={"height": IMAGE_SIDE, "width": IMAGE_SIDE}, crop_to_patches=False
    )
    processor = T.InternVLProcessor(
        image_processor=images, tokenizer=tok, video_processor=None, image_seq_length=4,
        chat_template=template,
    )  # fmt: skip
    return tok, config, processor


def _llava() -> VLParts:
    import transformers as T

    template = chat_template("<image>")
    tok = vl_tokenizer(["<image>"], {"image_token": "<image>"}, template)
    # CLIP tower; its last-but-one layer's patch features (the CLS one dropped) are
    # the image's 16 tokens.
    config = T.LlavaConfig(
        vision_config=dict(
            model_type="clip_vision_model", **TOWER, image_size=IMAGE_SIDE, patch_size=14,
            projection_dim=64,
        ),
        text_config=dict(model_type="llama", **_text(tok, head_dim=64)),
        image_token_index=_id(tok, "<image>"), image_seq_length=16,
        vision_feature_select_strategy="default", vision_feature_layer=-2,
    )  # fmt: skip
    images = T.CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIDE}, crop_size={"height": IMAGE_SIDE, "width": IMAGE_SIDE}
    )
    processor = T.LlavaProcessor(
        image_processor=images, tokenizer=tok, patch_size=14,
        vision_feature_select_strategy="default", num_additional_image_tokens=1,
        image_token="<image>", chat_template=template,
    )  # fmt: skip
    return tok, config, processor


def _gemma3() -> VLParts:
    import transformers as T

    named = {
        "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
        "image_token": "<image_soft_token>",
    }  # fmt: skip
    # The processor expands <start_of_image> into "\n\n", it, 4 x <image_soft_token>,
    # <end_of_image>, "\n\n". vLLM looks the newline runs up as vocabulary entries
    # (Gemma's SentencePiece vocabulary has them; byte-level BPE spells them "Ċ").
    template = chat_template("<start_of_image>", gemma=True)
    newlines = ("\n", "\n\n", "\n\n\n", "\n\n\n\n")
    tok = vl_tokenizer(list(named.values()), named, template, gemma=True, plain=newlines)
    text = _text(
        tok, initializer_range=GEMMA_INIT_STD, head_dim=64, query_pre_attn_scalar=64,
        sliding_window=GEMMA_SLIDING_WINDOW, layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip
    # SigLIP tower: 4 x 4 patches, pooled 2 x 2 into 4 image tokens.
    config = T.Gemma3Config(
        text_config=text,
        vision_config=dict(**TOWER, image_size=IMAGE_SIDE, patch_size=14, vision_use_head=False),
        mm_tokens_per_image=4, boi_token_index=_id(tok, "<start_of_image>"),
        eoi_token_index=_id(tok, "<end_of_image>"), image_token_index=_id(tok, "<image_soft_token>"),
        initializer_range=GEMMA_INIT_STD,
    )  # fmt: skip
    images = T.Gemma3ImageProcessor(size={"height": IMAGE_SIDE, "width": IMAGE_SIDE})
    processor = T.Gemma3Processor(
        image_processor=images, tokenizer=tok, image_seq_length=4, chat_template=template
    )
    return tok, config, processor


# transformers class name -> (tokenizer, config, processor). Names are what
# ``config.json`` lists under "architectures" and SUPPORT.md's rows are named by.
VL_ARCHS: dict[str, Callable[[], VLParts]] = {
    "Qwen2VLForConditionalGeneration": _qwen2_vl,
    "Qwen2_5_VLForConditionalGeneration": _qwen2_5_vl,
    "Qwen3VLForConditionalGeneration": _qwen3_vl,
    "InternVLForConditionalGeneration": _internvl,
    "LlavaForConditionalGeneration": _llava,
    "Gemma3ForConditionalGeneration": _gemma3,
}


def build_vl_model(arch: str, out_dir: str | Path, seed: int = 0) -> Path:
    """Write a random-weight tiny VL ``arch`` model, its tokenizer and processor to
    ``out_dir`` (atomically; an existing directory is replaced), with weights named
    as hub checkpoints name them (``rlpost.runtime.hf_format.use_hub_layout``)."""
    from rlpost.runtime.vl_compat import NoVideo, install

    install()
    import transformers

    from rlpost.runtime.hf_format import use_hub_layout

    if arch not in VL_ARCHS:
        raise ValueError(f"unknown VL architecture {arch!r}; choose one of {', '.join(VL_ARCHS)}")
    tok, config, processor = VL_ARCHS[arch]()
    config.architectures = [arch]
    torch.manual_seed(seed)
    model = getattr(transformers, arch)(config).float()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2 and not p.any():  # a projector transformers starts at zero
                p.normal_(0.0, INIT_STD)
    use_hub_layout(model)
    if getattr(processor, "video_processor", NoVideo()) is None:
        processor.video_processor = NoVideo()  # saved as an empty part, loaded as one
    Path(out_dir).parent.mkdir(parents=True, exist_ok=True)
    with atomic_directory(out_dir) as tmp:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    return Path(out_dir)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m rlpost.models.vl",
        description="Write a tiny random-weight vision-language model directory.",
    )
    parser.add_argument("arch", choices=list(VL_ARCHS), help="transformers class")
    parser.add_argument("out_dir", help="directory to write (replaced if it exists)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(build_vl_model(args.arch, args.out_dir, args.seed))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
