"""Export a training checkpoint as a Hugging Face model directory (LoRA merged).

    python -m rlpost.export CHECKPOINT OUT_DIR

CHECKPOINT is a run checkpoint (``run_dir/checkpoints/step_N``, whose
``policy/`` is used) or an engine checkpoint directory. The result loads with
transformers (``AutoModelForCausalLM``, or ``AutoModelForImageTextToText`` for
a vision-language model) and with vLLM, its weights named as hub checkpoints
name them (``rlpost.trainers.hf_format.use_hub_layout``); the tokenizer, and a VL
model's processor, are copied from the base model the run trained.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlpost.trainers.files import atomic_directory, check_dcp_metadata


def engine_dir(checkpoint: str | Path) -> Path:
    path = Path(checkpoint)
    if (path / "policy" / "engine.json").exists():
        return path / "policy"
    if (path / "engine.json").exists():
        return path
    raise FileNotFoundError(
        f"{checkpoint}: no engine checkpoint here (expected engine.json or policy/engine.json)"
    )


def export(checkpoint: str | Path, out_dir: str | Path) -> Path:
    """Write the checkpoint's policy to ``out_dir`` as an HF model, atomically."""
    import torch.distributed.checkpoint as dcp

    from rlpost.trainers.fsdp.common import DTYPES
    from rlpost.trainers.fsdp.lora import LoraSettings, apply_lora
    from rlpost.trainers.fsdp.state import read_meta
    from rlpost.trainers.hf_format import load_model, save_preprocessing, use_hub_layout

    src = engine_dir(checkpoint)
    check_dcp_metadata(src / "state")  # before torch unpickles it without limits
    meta = read_meta(src)
    cfg = meta["config"]
    base = cfg["model_path"]
    lora_raw = dict(cfg["lora"])
    if isinstance(lora_raw["target_modules"], list):
        lora_raw["target_modules"] = tuple(lora_raw["target_modules"])
    lora = LoraSettings(**lora_raw)
    model = load_model(base, DTYPES[cfg["dtype"]])
    if lora.enabled:
        model = apply_lora(model, lora, base)
    state = model.state_dict()
    if meta["frozen_base"]:  # the checkpoint holds the adapter; the base comes from `base`
        state = {k: v for k, v in state.items() if ".lora_A." in k or ".lora_B." in k}
    # No process group: DCP reads every shard into these tensors, in place.
    dcp.load({"model": state}, checkpoint_id=str(src / "state"))
    if lora.enabled:
        model = model.merge_and_unload()  # type: ignore[operator]
    out = Path(out_dir)
    with atomic_directory(out) as tmp:
        use_hub_layout(model).save_pretrained(tmp)
        save_preprocessing(base, tmp)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlpost.export", description=__doc__)
    parser.add_argument("checkpoint", help="run_dir/checkpoints/step_N or an engine checkpoint")
    parser.add_argument("out_dir", help="where to write the HF model directory")
    args = parser.parse_args(argv)
    try:
        path = export(args.checkpoint, args.out_dir)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
