"""Where the service keeps its tenants' checkpoints, and who may read them.

A checkpoint is ``tinker://<model id>/weights/<name>`` (adapter and optimizer
state) or ``tinker://<model id>/sampler_weights/<name>`` (adapter), a folder
``<state dir>/runs/<model id>/<kind>/<name>`` whose ``meta.json`` names the API
key's owner that wrote it. A path is read only for that owner, and only under
the state directory: a name is letters, digits, ``_``, ``.`` and ``-``, and a
model id is the service's own ``s<hex>:train:<n>``.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

from rlpost.serve.errors import NotFound, UserError
from rlpost.serve.host import read_meta

NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
MODEL_ID = re.compile(r"^(s[0-9a-f]{16}):train:(\d+)$")
KINDS = {"weights": "training", "sampler_weights": "sampler"}  # path kind -> the SDK's type


def stamp(seconds: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


class Checkpoints:
    """The checkpoint folders under ``state_dir``."""

    def __init__(self, state_dir: Path):
        self.root = state_dir / "runs"

    def run_dir(self, model_id: str) -> Path:
        return self.root / model_id.replace(":", "_")

    def folder(self, model_id: str, kind: str, name: object) -> Path:
        """Where ``tinker://<model_id>/<kind>/<name>`` is kept (``name`` checked)."""
        if not isinstance(name, str) or not NAME.match(name):
            raise UserError(f"checkpoint name {name!r}: letters, digits, '_', '.' and '-' only "
                            "(at most 128, not starting with '.' or '-')")  # fmt: skip
        return self.run_dir(model_id) / kind / name

    def readable(self, path: object, owner: str) -> tuple[str, Path]:
        """(kind, folder) of the ``tinker://`` ``path`` that ``owner`` wrote; NotFound
        for any other, so that a guessed path says nothing of another key's."""
        text = str(path)
        parts = text.removeprefix("tinker://").split("/")
        if not text.startswith("tinker://") or len(parts) != 3 or parts[1] not in KINDS:
            raise UserError(f"{text!r} is not a checkpoint path: tinker://<model id>/weights/<name> "
                            "or tinker://<model id>/sampler_weights/<name>")  # fmt: skip
        model_id, kind, name = parts
        if not MODEL_ID.match(model_id):
            raise NotFound(f"no checkpoint {text}")
        where = self.folder(model_id, kind, name)
        meta = read_meta(where) if where.is_dir() else None
        if meta is None or meta.get("owner") != owner:
            raise NotFound(f"no checkpoint {text} (or it was written with another key)")
        return kind, where

    def delete(self, path: str, owner: str) -> None:
        shutil.rmtree(self.readable(path, owner)[1])

    def listing(self, run_id: str) -> list[dict]:
        """The run's checkpoints as the SDK's ``list_checkpoints`` reads them."""
        found = []
        for kind, kind_name in KINDS.items():
            folder = self.run_dir(run_id) / kind
            for where in sorted(folder.glob("*")) if folder.is_dir() else []:
                if where.name.startswith(".") or not (where / "meta.json").exists():
                    continue
                size = sum(f.stat().st_size for f in where.iterdir())
                found.append({"checkpoint_id": f"{kind}/{where.name}", "checkpoint_type": kind_name,
                              "time": stamp(where.stat().st_mtime),
                              "tinker_path": f"tinker://{run_id}/{kind}/{where.name}",
                              "size_bytes": size, "public": False})  # fmt: skip
        return found

    def newest_meta(self, run_id: str, owner: str) -> dict | None:
        """The metadata of the last checkpoint ``owner``'s run ``run_id`` wrote (a run
        no longer served is known by its checkpoints); None without one."""
        if not MODEL_ID.match(run_id):
            return None
        run = self.run_dir(run_id)
        metas = [read_meta(w) for kind in KINDS for w in sorted((run / kind).glob("*"))
                 if (w / "meta.json").is_file()]  # fmt: skip
        metas = [m for m in metas if m.get("owner") == owner]
        return metas[-1] if metas else None

    @staticmethod
    def info(where: Path) -> dict:
        """What the SDK's ``weights_info`` reads of a checkpoint."""
        meta = read_meta(where)
        lora = meta["lora"]
        return {
            "base_model": meta["base_model"], "is_lora": True, "lora_rank": lora["rank"],
            "train_unembed": lora["train_unembed"], "train_mlp": lora["train_mlp"],
            "train_attn": lora["train_attn"], "optimizer_config": {"type": "adamw"},
        }  # fmt: skip
