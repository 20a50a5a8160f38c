"""The torchvision-less layer: image processors resolve to their PIL twins, video
processors refuse to be built, and a VL processor saves and loads without one."""

from __future__ import annotations

import subprocess
import sys
from importlib import import_module

import pytest

from rlpost.runtime.vl_compat import install, load_hint, torchvision_available

pytestmark = pytest.mark.skipif(torchvision_available(), reason="the layer is off with torchvision")


def test_a_torchvision_image_processor_module_is_its_pil_twin():
    """Imported by its full name, as vLLM's model modules import it."""
    assert install()
    pil = import_module("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    tv = import_module("transformers.models.qwen2_vl.image_processing_qwen2_vl")

    assert tv.Qwen2VLImageProcessor is pil.Qwen2VLImageProcessorPil
    assert tv.Qwen2VLImageProcessorFast is pil.Qwen2VLImageProcessorPil
    assert tv.smart_resize is pil.smart_resize  # helpers vLLM imports by name


def test_a_video_processor_refuses_to_be_built_with_the_reason():
    install()
    video = import_module("transformers.models.qwen2_vl.video_processing_qwen2_vl")
    with pytest.raises(ImportError, match="needs torchvision"):
        video.Qwen2VLVideoProcessor()


def test_a_vl_processor_saves_and_loads_and_expands_the_image(tmp_path):
    from PIL import Image
    from transformers import AutoProcessor

    from rlpost.models.vl import IMAGE_SIDE, build_vl_model

    path = build_vl_model("Qwen2VLForConditionalGeneration", tmp_path / "vl", seed=0)
    processor = AutoProcessor.from_pretrained(path)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    image = Image.new("RGB", (IMAGE_SIDE, IMAGE_SIDE), (255, 0, 0))
    enc = processor(text=[text], images=[image], return_tensors="pt")
    # 56 px / 14 px patches = 4 x 4 patches, merged 2 x 2 -> 4 image tokens
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert int((enc["input_ids"] == pad).sum()) == 4
    assert enc["image_grid_thw"].tolist() == [[1, 4, 4]]
    # each patch row: 3 channels x 2 frames x 14 x 14 pixels
    assert tuple(enc["pixel_values"].shape) == (16, 3 * 2 * 14 * 14)


def test_lora_and_freezing_leave_the_vision_tower_alone(tmp_path):
    import torch

    from rlpost.models.vl import build_vl_model
    from rlpost.runtime.hf_format import load_model, vision_parameters
    from rlpost.trainers.fsdp.lora import LoraSettings, apply_lora

    path = build_vl_model("Qwen2VLForConditionalGeneration", tmp_path / "vl", seed=0)
    model = load_model(str(path), torch.float32)
    vision = {id(p) for p in vision_parameters(model)}
    assert vision and len(vision) < len(list(model.parameters()))
    assert all(id(p) in vision for p in model.model.visual.parameters())
    adapted = apply_lora(model, LoraSettings(rank=4), str(path))  # target_modules: all-linear
    trainable = [n for n, p in adapted.named_parameters() if p.requires_grad]
    assert trainable and all(".language_model." in n for n in trainable)


# A fresh interpreter that never imports rlpost: plain transformers, as a user loads
# a model directory rlpost wrote. ``prelude`` runs first.
LOAD = (
    "import sys\n{prelude}\nfrom transformers import AutoProcessor\n"
    "p = AutoProcessor.from_pretrained(sys.argv[1])\n"
    "print(type(p).__name__, 'rlpost' in sys.modules)\n"
)


def _load(path, prelude: str = "") -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", LOAD.format(prelude=prelude), str(path)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_an_image_only_vl_processor_loads_in_plain_transformers(tmp_path):
    """LLaVA's processor has no video processor: its image processor falls back to the
    PIL twin by itself, so the saved directory loads without the layer and no hint is
    given."""
    from rlpost.models.vl import build_vl_model

    path = build_vl_model("LlavaForConditionalGeneration", tmp_path / "vl", seed=0)
    proc = _load(path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["LlavaProcessor", "False"]
    assert load_hint(path) is None


def test_a_vl_processor_with_video_needs_the_call_the_hint_names(tmp_path):
    """Qwen2-VL's processor declares a video processor, which transformers builds only
    with torchvision whatever the files say: plain AutoProcessor fails, the hint names
    the call, and with that call first it loads."""
    from rlpost.models.vl import build_vl_model

    path = build_vl_model("Qwen2VLForConditionalGeneration", tmp_path / "vl", seed=0)
    plain = _load(path)
    assert plain.returncode != 0 and "requires `torchvision`" in plain.stderr
    hint = load_hint(path)
    assert hint is not None and f"AutoProcessor.from_pretrained('{path}')" in hint
    call = "from rlpost.runtime.vl_compat import install; install()"
    assert f"`{call}`" in hint
    proc = _load(path, prelude=call)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["Qwen2VLProcessor", "True"]
