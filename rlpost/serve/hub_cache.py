"""A served model's tokenizer in the local Hugging Face cache under the name
clients ask for (``rlpost serve --hf-cache``).

A client such as the tinker cookbook loads the tokenizer of ``model_name`` with
``AutoTokenizer.from_pretrained(model_name)``. On a machine without the hub, a
model served from a folder as ``Qwen/Qwen3-0.6B`` is then found only if the
cache holds that name: this writes a snapshot of the folder's tokenizer files
(links to them, as the cache links its blobs) under the name, so that the
client, with ``HF_HUB_OFFLINE=1``, loads them unchanged.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

# What ``AutoTokenizer`` and ``AutoProcessor`` read from a model folder.
TOKENIZER_FILES = (
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "chat_template.json",
    "tokenizer.model", "vocab.json", "vocab.txt", "merges.txt", "preprocessor_config.json",
    "processor_config.json",
)  # fmt: skip


def cached(name: str, cache: Path | None = None) -> bool:
    """Whether the local cache resolves ``name`` (offline)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        snapshot_download(name, local_files_only=True, cache_dir=cache)
    except (LocalEntryNotFoundError, ValueError, OSError):
        return False
    return True


def register_tokenizer(name: str, folder: str | Path, cache: Path | None = None) -> Path | None:
    """Link ``folder``'s tokenizer files into the cache (``HF_HUB_CACHE`` unless
    ``cache``) as the model ``name`` (``org/model``); returns the snapshot written,
    or None when the cache already resolves ``name`` (it is left as it is)."""
    from huggingface_hub import constants

    if name.count("/") != 1 or not all(name.split("/")):
        raise ValueError(f"--hf-cache: {name!r} is not a hub name (org/model): serve the folder "
                         "as NAME=PATH with such a name")  # fmt: skip
    if cached(name, cache):
        return None
    src = Path(folder).resolve()
    files = [f for f in TOKENIZER_FILES if (src / f).is_file()]
    if "tokenizer_config.json" not in files and "tokenizer.json" not in files:
        raise ValueError(f"--hf-cache: {src} holds no tokenizer (tokenizer.json or "
                         "tokenizer_config.json) to put in the cache")  # fmt: skip
    # The revision names what the snapshot links: the same folder, the same name.
    digest = hashlib.sha1(f"{name}\n{src}".encode())
    for f in files:
        digest.update(f"\n{f} {(src / f).stat().st_size}".encode())
    revision = digest.hexdigest()
    repo = Path(cache or constants.HF_HUB_CACHE) / f"models--{name.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    for f in files:
        link = snapshot / f
        if not link.is_symlink():
            link.symlink_to(src / f)
    refs = repo / "refs"
    refs.mkdir(exist_ok=True)
    tmp = refs / f".main.{os.getpid()}"
    tmp.write_text(revision)
    tmp.replace(refs / "main")  # the name resolves only once the snapshot is whole
    return snapshot
