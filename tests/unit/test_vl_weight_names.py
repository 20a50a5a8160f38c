"""Weight names of vision-language models as they leave the trainer (weight sync,
``save_pretrained``): CLIP and SigLIP vision towers (LLaVA, Gemma 3) are nested
under ``vision_tower.vision_model.`` as hub checkpoints and vLLM name them,
whether transformers built the model from a config, loaded it from hub names or
loaded it from a directory that transformers 5 wrote without the nesting."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from rlpost.models.vl import VL_ARCHS, build_vl_model
from rlpost.runtime.hf_format import load_model, to_checkpoint_format, use_hub_layout
from rlpost.runtime.vl_compat import install

NESTED = ("LlavaForConditionalGeneration", "Gemma3ForConditionalGeneration")


def _file_names(directory) -> set[str]:
    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        return set(f.keys())


def untied(state: dict) -> dict:
    return {k: v for k, v in state.items() if "lm_head" not in k}


def _from_config(arch: str):
    install()
    import transformers

    _, config, _ = VL_ARCHS[arch]()
    torch.manual_seed(0)
    return getattr(transformers, arch)(config)


@pytest.mark.parametrize("arch", NESTED)
def test_a_model_built_from_a_config_leaves_with_hub_names(arch, tmp_path):
    model = _from_config(arch)
    # what transformers itself writes for this model lacks the level
    model.save_pretrained(tmp_path / "plain")
    assert any(n.startswith("vision_tower.embeddings.") for n in _file_names(tmp_path / "plain"))
    names = set(to_checkpoint_format(model, model.state_dict()))
    tower = sorted(n for n in names if n.startswith("vision_tower."))
    assert tower and all(n.startswith("vision_tower.vision_model.") for n in tower)
    use_hub_layout(model).save_pretrained(tmp_path / "hub")
    saved = _file_names(tmp_path / "hub")
    # the sync also sends a tied head's copy (Gemma 3's), which the files leave out
    assert saved <= names and {n for n in names - saved if "lm_head" not in n} == set()


@pytest.mark.parametrize("arch", NESTED)
def test_hub_names_and_plain_names_load_to_the_same_model_and_leave_as_hub_names(arch, tmp_path):
    model = _from_config(arch)
    model.save_pretrained(tmp_path / "plain")  # vision_tower.embeddings.*
    use_hub_layout(model).save_pretrained(tmp_path / "hub")  # vision_tower.vision_model.*
    # A tied head's copy (Gemma 3's) is named by whichever renaming the load used;
    # the engine ties or drops it. Every other name is the hub's.
    expected = untied(to_checkpoint_format(model, model.state_dict()))
    for layout in ("plain", "hub"):
        loaded = load_model(str(tmp_path / layout), torch.float32)
        out = untied(to_checkpoint_format(loaded, loaded.state_dict()))
        assert out.keys() == expected.keys(), layout  # nested once, never twice
        assert all(torch.equal(out[k], expected[k]) for k in expected), layout


def test_a_qwen_vl_model_keeps_transformers_names(tmp_path):
    from transformers.core_model_loading import revert_weight_conversion

    path = build_vl_model("Qwen2VLForConditionalGeneration", tmp_path / "qwen", seed=0)
    model = load_model(str(path), torch.float32)
    state = model.state_dict()
    names = set(to_checkpoint_format(model, state))
    assert names == set(revert_weight_conversion(model, dict(state))) == _file_names(path)
    assert not any("vision_model" in n for n in names)
