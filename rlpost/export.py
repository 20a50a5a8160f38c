"""Export a training checkpoint as a Hugging Face model directory (LoRA merged).

    python -m rlpost.export CHECKPOINT OUT_DIR

CHECKPOINT is a run checkpoint (``run_dir/checkpoints/step_N``, whose
``policy/`` is used) or an engine checkpoint directory, written by either
trainer: FSDP2 (a sharded DCP state) or Megatron (one file per rank, merged
here from any tp/pp/ep split). A run directory or its ``checkpoints/`` folder
is refused with the list of its checkpoints to pass (none is picked for you;
``run_dir/final`` is already the last step's HF model). The result loads with
transformers (``AutoModelForCausalLM``, or ``AutoModelForImageTextToText`` for
a vision-language model) and with vLLM, its weights named as hub checkpoints
name them (``rlpost.runtime.hf_format.use_hub_layout``); the tokenizer, and a VL
model's processor, are copied from the base model the run trained.

Without torchvision, a VL processor with a video processor (Qwen2-VL, Qwen2.5-VL,
Qwen3-VL, InternVL) loads with ``AutoProcessor.from_pretrained(OUT_DIR)`` only
after ``from rlpost.runtime.vl_compat import install; install()``; the export
prints that note when it applies.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlpost.trainers.files import atomic_directory, check_dcp_metadata

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def engine_dir(checkpoint: str | Path) -> Path:
    """The engine checkpoint ``checkpoint`` names; FileNotFoundError saying what to
    pass instead for a missing path, a run directory or its ``checkpoints/``."""
    path = Path(checkpoint)
    if not path.exists():
        raise FileNotFoundError(f"{checkpoint} does not exist")
    if (path / "policy" / "engine.json").exists():
        return path / "policy"
    if (path / "engine.json").exists():
        return path
    run_dir = path.parent if path.name == "checkpoints" else path
    if (run_dir / "checkpoints").is_dir():
        what = "a run's checkpoints folder" if run_dir != path else "a run directory"
        raise FileNotFoundError(f"{checkpoint} is {what}, not a checkpoint; {_listing(run_dir)}")
    raise FileNotFoundError(
        f"{checkpoint}: no engine checkpoint here (expected engine.json or policy/engine.json); "
        "pass a run's checkpoint, run_dir/checkpoints/step_N"
    )


def _listing(run_dir: Path) -> str:
    """The run's complete checkpoints, and which to pass."""
    from rlpost.loop.checkpoint import CheckpointManager

    found = [str(p) for _, p in CheckpointManager(run_dir, keep_last=1).complete()]
    final = run_dir / "final"
    also = ""
    if final.is_dir():
        also = f"\n({final} is the run's last policy, already an HF model directory)"
    if not found:
        return f"it has no complete checkpoint to export{also}"
    listed = "".join(f"\n  {p}" for p in found)
    return (
        f"pass one of its checkpoints (oldest first):{listed}\n"
        f"the latest: python -m rlpost.export {found[-1]} OUT_DIR{also}"
    )


def _fsdp_policy(src: Path, meta: dict[str, Any]) -> PreTrainedModel:
    """The HF model of an FSDP2 checkpoint (its DCP ``.metadata`` checked already): the
    base model with the DCP state (the adapter only, under LoRA) loaded in, LoRA merged."""
    import torch.distributed.checkpoint as dcp

    from rlpost.runtime.hf_format import load_model
    from rlpost.trainers.engine_config import torch_dtype
    from rlpost.trainers.fsdp.lora import LoraSettings, apply_lora

    cfg = meta["config"]
    base = cfg["model_path"]
    lora_raw = dict(cfg["lora"])
    if isinstance(lora_raw["target_modules"], list):
        lora_raw["target_modules"] = tuple(lora_raw["target_modules"])
    lora = LoraSettings(**lora_raw)
    model = load_model(base, torch_dtype(cfg["dtype"]))
    if lora.enabled:
        model = apply_lora(model, lora, base)
    state = model.state_dict()
    if meta["frozen_base"]:  # the checkpoint holds the adapter; the base comes from `base`
        state = {k: v for k, v in state.items() if ".lora_A." in k or ".lora_B." in k}
    # No process group: DCP reads every shard into these tensors, in place.
    dcp.load({"model": state}, checkpoint_id=str(src / "state"))
    if lora.enabled:
        model = model.merge_and_unload()  # type: ignore[operator]
    return model


def _megatron_policy(src: Path, meta: dict[str, Any]) -> PreTrainedModel:
    """The HF model of a Megatron checkpoint: every rank's shards merged into full
    Megatron tensors, converted to HF names as the engine's own export does."""
    from transformers import AutoConfig

    from rlpost.runtime.hf_format import model_from_checkpoint_weights
    from rlpost.trainers.engine_config import torch_dtype
    from rlpost.trainers.megatron.checkpoint import full_weights
    from rlpost.trainers.megatron.convert import megatron_to_hf, shape_from_hf

    cfg = meta["config"]
    hf_config = AutoConfig.from_pretrained(cfg["model_path"])
    hf = megatron_to_hf(full_weights(src, meta), shape_from_hf(hf_config))
    return model_from_checkpoint_weights(hf_config, list(hf.items()), torch_dtype(cfg["dtype"]))


def export(checkpoint: str | Path, out_dir: str | Path) -> Path:
    """Write the checkpoint's policy to ``out_dir`` as an HF model, atomically."""
    from rlpost.runtime.hf_format import save_preprocessing, use_hub_layout
    from rlpost.trainers.fsdp.state import read_meta

    src = engine_dir(checkpoint)
    fsdp = (src / "state").is_dir()  # FSDP2: a DCP state; Megatron: rank files only
    if fsdp:
        check_dcp_metadata(src / "state")  # before torch, or anything else, reads it
    meta = read_meta(src)
    model = _fsdp_policy(src, meta) if fsdp else _megatron_policy(src, meta)
    out = Path(out_dir)
    with atomic_directory(out) as tmp:
        use_hub_layout(model).save_pretrained(tmp)
        save_preprocessing(meta["config"]["model_path"], tmp)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rlpost.export",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("checkpoint", help="run_dir/checkpoints/step_N or an engine checkpoint")
    parser.add_argument("out_dir", help="where to write the HF model directory")
    args = parser.parse_args(argv)
    try:
        path = export(args.checkpoint, args.out_dir)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    from rlpost.runtime.vl_compat import load_hint

    hint = load_hint(path)
    if hint:
        print(hint, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
