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
