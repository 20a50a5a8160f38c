"""What a vision-language model's forward takes besides token ids.

The driver runs the model's image processor once per prompt and hands each of
the prompt's samples the outputs (``pixel_values``, ``image_grid_thw``, ...),
so trainer ranks need no processor and a sample's images travel with it
through sharding and micro-batching (``TrajectoryBatch.mm_inputs_b``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rlpost.runtime.hf_format import is_vision_language

if TYPE_CHECKING:
    from PIL import Image

__all__ = ["ImageInputs", "forward_inputs", "is_vision_language"]


class ImageInputs:
    """The image processor of the model at ``model_path``, as a function of a
    prompt's images."""

    def __init__(self, model_path: str):
        from transformers import AutoProcessor

        from rlpost.runtime.vl_compat import install

        install()
        self.processor = AutoProcessor.from_pretrained(model_path)
        self.image_processor = self.processor.image_processor

    def __call__(self, images: list[Image.Image] | None) -> dict[str, torch.Tensor]:
        out = self.image_processor(images=images, return_tensors="pt")
        return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}

    def encode(
        self, text: str, images: list[Image.Image] | None
    ) -> tuple[list[int], dict[str, torch.Tensor]]:
        """A templated prompt's token ids with each image placeholder expanded into
        the image's tokens (as the rollout engine expands it), and the image inputs."""
        out = self.processor(text=[text], images=images, return_tensors="pt")
        return out["input_ids"][0].tolist(), self(images)


def forward_inputs(mm_inputs_b: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """One forward pass's image inputs: each key's per-sample tensors joined along
    dim 0 (patches, or images), in the samples' order."""
    keys = [k for k in mm_inputs_b[0]]
    return {k: torch.cat([m[k] for m in mm_inputs_b]) for k in keys}
