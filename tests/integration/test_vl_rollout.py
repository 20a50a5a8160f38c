"""A vision-language model on vLLM-CPU: a prompt with an image is expanded as the
transformers processor expands it, and the sampled tokens' log-probs equal a
transformers forward over the same ids and image."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from rlpost.models.vl import IMAGE_SIDE, build_vl_model  # noqa: E402
from rlpost.rollout.base import GenerationRequest, SamplingConfig  # noqa: E402
from rlpost.rollout.vllm import VLLMEngineConfig  # noqa: E402
from rlpost.rollout.vllm.engine import VLLMEngine  # noqa: E402
from rlpost.runtime.hf_format import placeholder_token_ids  # noqa: E402


@pytest.fixture(scope="module")
def qwen2_vl(tmp_path_factory):
    return build_vl_model("Qwen2VLForConditionalGeneration", tmp_path_factory.mktemp("vl") / "m")


def test_vllm_samples_from_an_image_as_transformers_scores_it(qwen2_vl):
    import transformers
    from PIL import Image
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(qwen2_vl)
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]}
    ]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    images = [Image.new("RGB", (IMAGE_SIDE, IMAGE_SIDE), c) for c in ((250, 20, 20), (20, 20, 250))]
    engine = VLLMEngine(VLLMEngineConfig(model_path=str(qwen2_vl), kv_cache_gib=0.0625))
    raw = processor.tokenizer(text)["input_ids"]  # one <|image_pad|> per image
    sampling = SamplingConfig(n=2, temperature=1.0, max_tokens=6, seed=0)
    results = engine.generate([GenerationRequest(raw, sampling, images=[im]) for im in images])

    model = transformers.Qwen2VLForConditionalGeneration.from_pretrained(qwen2_vl).eval()
    gaps = []
    for image, result in zip(images, results):
        enc = processor(text=[text], images=[image], return_tensors="pt")
        assert result.prompt_ids == enc["input_ids"][0].tolist()  # 4 image tokens, as HF has
        for c in result.completions:
            ids = torch.tensor([result.prompt_ids + c.token_ids])
            with torch.no_grad():
                logits = model(
                    input_ids=ids, pixel_values=enc["pixel_values"],
                    image_grid_thw=enc["image_grid_thw"],
                    mm_token_type_ids=(ids == model.config.image_token_id).long(),
                ).logits  # fmt: skip
            # Neither side samples the image placeholder token (placeholder_token_ids).
            logits[..., placeholder_token_ids(model.config)] = torch.finfo(logits.dtype).min
            logp = torch.log_softmax(logits[0, len(result.prompt_ids) - 1 : -1], dim=-1)
            hf = logp[torch.arange(len(c.token_ids)), torch.tensor(c.token_ids)]
            gaps.append(float((hf - torch.tensor(c.logprobs)).abs().max()))
    assert max(gaps) < 1e-4, gaps
    # The image matters: the two images' prompts give different next-token laws.
    first = [r.completions[0].logprobs[0] for r in results]
    assert first[0] != first[1]


def test_a_text_model_refuses_images(tmp_path):
    from PIL import Image

    from rlpost.models.tiny import build_tiny_model

    path = str(build_tiny_model("micro", tmp_path / "micro", seed=0))
    engine = VLLMEngine(VLLMEngineConfig(model_path=path, kv_cache_gib=0.0625))
    image = Image.new("RGB", (IMAGE_SIDE, IMAGE_SIDE))
    request = GenerationRequest([1, 2, 3], SamplingConfig(max_tokens=2), images=[image])
    with pytest.raises(ValueError, match="is not a vision-language model"):
        engine.generate([request])
