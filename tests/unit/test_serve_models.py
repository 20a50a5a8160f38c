"""``rlpost serve --model``: a folder, NAME=PATH, or a name from the Hugging Face cache."""

from __future__ import annotations

import json

import pytest

from rlpost.serve.__main__ import parse_models


def _snapshot(cache, name: str, rev: str = "0123abcd") -> str:
    """Lay out a hub cache entry the way huggingface_hub writes one."""
    repo = cache / f"models--{name.replace('/', '--')}"
    snap = repo / "snapshots" / rev
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    return str(snap)


def test_a_cached_hub_name_a_folder_and_name_eq_path(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(cache))
    snap = _snapshot(cache, "Qwen/Qwen3-0.6B")
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    models = parse_models(["Qwen/Qwen3-0.6B", str(folder), f"mine={folder}"])
    assert models == {"Qwen/Qwen3-0.6B": snap, "my-model": str(folder), "mine": str(folder)}


def test_a_name_the_cache_lacks_says_how_to_fetch_it(tmp_path, monkeypatch):
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SystemExit, match="hf download Org/Missing"):
        parse_models(["Org/Missing"])
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match="served twice"):
        parse_models([f"a={folder}", f"a={folder}"])


def test_hf_cache_puts_a_folders_tokenizer_under_the_served_name(tmp_path, monkeypatch):
    """``rlpost serve --hf-cache``: AutoTokenizer loads the served name offline, the
    same tokens as from the folder; a name the cache holds already is left alone."""
    import huggingface_hub.constants as hc
    from transformers import AutoTokenizer

    from rlpost.models.tiny import build_tiny_model
    from rlpost.serve.hub_cache import register_tokenizer

    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)  # read at import: no network tried
    folder = build_tiny_model("micro", tmp_path / "m", seed=0)
    snapshot = register_tokenizer("Org/Served", folder, cache)
    assert (
        snapshot is not None
        and (snapshot / "tokenizer.json").resolve() == (folder / "tokenizer.json").resolve()
    )
    assert not (snapshot / "model.safetensors").exists()  # the tokenizer's files only
    by_name = AutoTokenizer.from_pretrained("Org/Served", cache_dir=cache)
    by_folder = AutoTokenizer.from_pretrained(folder)
    text = "What is 12 + 30?"
    assert by_name(text)["input_ids"] == by_folder(text)["input_ids"]
    assert register_tokenizer("Org/Served", folder, cache) is None  # already there
    _snapshot(cache, "Qwen/Qwen3-0.6B")
    assert register_tokenizer("Qwen/Qwen3-0.6B", folder, cache) is None
    assert (cache / "models--Qwen--Qwen3-0.6B" / "refs" / "main").read_text() == "0123abcd"
    with pytest.raises(ValueError, match="not a hub name"):
        register_tokenizer("just-a-name", folder, cache)
