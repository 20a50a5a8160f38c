"""Tiny vision-language models (rlpost.models.vl): each directory's processor loads
back, its chat template renders an image part as the model's placeholder, and
the processor expands one image into the number of tokens the config promises.

The whole loop (FSDP2, vLLM, weight sync, GRPO, export) runs on them in
``python -m rlpost.support`` and tests/integration/test_model_matrix.py.
"""

from __future__ import annotations

import pytest
import torch

from rlpost.models.vl import IMAGE_SIDE, VL_ARCHS, build_vl_model
from rlpost.runtime.hf_format import placeholder_token_ids
from rlpost.runtime.vl_compat import install

# arch -> (placeholder the template writes, image tokens one image becomes)
EXPECTED = {
    # 56 px / 14 px = 4 x 4 patches, merged 2 x 2 -> 4
    "Qwen2VLForConditionalGeneration": ("<|image_pad|>", 4),
    "Qwen2_5_VLForConditionalGeneration": ("<|image_pad|>", 4),
    # resized to 64 px / 16 px = 4 x 4 patches, merged 2 x 2 -> 4
    "Qwen3VLForConditionalGeneration": ("<|image_pad|>", 4),
    # 4 x 4 patches, pixel-shuffled at ratio 0.5 -> 4
    "InternVLForConditionalGeneration": ("<IMG_CONTEXT>", 4),
    # 4 x 4 patches, one token each (the CLS feature dropped) -> 16
    "LlavaForConditionalGeneration": ("<image>", 16),
    # 4 x 4 patches, pooled 2 x 2 -> 4
    "Gemma3ForConditionalGeneration": ("<start_of_image>", 4),
}
MESSAGES = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]}]


def test_every_architecture_has_an_expectation():
    assert set(EXPECTED) == set(VL_ARCHS)


@pytest.mark.parametrize("arch", list(VL_ARCHS))
def test_the_processor_expands_the_template_s_placeholder_into_the_image_s_tokens(arch, tmp_path):
    install()
    from PIL import Image
    from transformers import AutoConfig, AutoProcessor

    path = build_vl_model(arch, tmp_path / "m", seed=0)
    processor = AutoProcessor.from_pretrained(path)
    config = AutoConfig.from_pretrained(path)
    placeholder, n_tokens = EXPECTED[arch]
    text = processor.tokenizer.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True
    )
    assert text.count(placeholder) == 1
    image = Image.new("RGB", (IMAGE_SIDE, IMAGE_SIDE), (200, 30, 30))
    ids = processor(text=[text], images=[image], return_tensors="pt")["input_ids"][0]
    assert int((ids == config.image_token_id).sum()) == n_tokens
    assert placeholder_token_ids(config) and config.image_token_id in placeholder_token_ids(config)
    # every token has an embedding row, and the tokenizer's ids are below the vocabulary
    text_config = config.get_text_config()
    assert len(processor.tokenizer) <= text_config.vocab_size
    assert int(ids.max()) < text_config.vocab_size


def test_no_weight_starts_at_zero(tmp_path):
    """Gemma 3's projector starts at zero in transformers: an image would change nothing."""
    from safetensors.torch import load_file

    path = build_vl_model("Gemma3ForConditionalGeneration", tmp_path / "g", seed=0)
    weights = load_file(str(path / "model.safetensors"))
    zero = [k for k, v in weights.items() if v.ndim >= 2 and not torch.any(v)]
    assert not zero
