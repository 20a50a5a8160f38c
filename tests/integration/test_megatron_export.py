"""``python -m rlpost.export`` on Megatron checkpoints split over tensor- and
pipeline-parallel ranks (a dense model) and over expert-parallel ranks (an MoE
model): the exported HF model holds exactly the engine's weights.

Each checkpoint is an engine save in-process (gloo) after one SFT step, in a run's
step directory, as a run writes it; the export runs through the real CLI.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from engine_utils import free_port, make_batch

from rlpost.models.archs import build_arch_model
from rlpost.models.tiny import build_tiny_model

pytest.importorskip("megatron.core")

PRELOAD = ["rlpost.models.tiny", "rlpost.trainers.megatron.engine"]
# name: (world size, megatron settings)
LAYOUTS = {
    # the tiny preset: 4 layers, 4 heads, 2 key/value heads, tied embeddings
    "tp2_pp2": (4, {"tp": 2, "pp": 2}),
    # Qwen3-MoE, 4 experts: 2 on each rank
    "moe_ep2": (2, {"ep": 2}),
}


def _build(layout: str, out: Path) -> Path:
    if layout.startswith("moe"):
        return build_arch_model("Qwen3MoeForCausalLM", out)
    return build_tiny_model("tiny", out, seed=0)


def _save_worker(
    rank: int, world: int, parallel: dict, model_dir: str, port: int, step_dir: str, out: str
) -> None:
    """One SFT step (so the weights are not the base model's), a checkpoint of the
    policy into ``step_dir/policy``, and rank 0's full HF-named weights to ``out``."""
    from rlpost.trainers.megatron.engine import (
        MegatronEngine,
        MegatronEngineConfig,
        MegatronParallel,
    )

    cfg = MegatronEngineConfig(
        model_path=model_dir,
        parallel=MegatronParallel(**parallel),
        lr=1e-2,
        lr_warmup_steps=0,
        micro_batch_size=8,
    )
    engine = MegatronEngine(cfg, rank, world, f"tcp://127.0.0.1:{port}")
    engine.update_sft(make_batch(seed=2).shard(rank, world))
    engine.save_checkpoint(str(Path(step_dir) / "policy"))
    weights = engine.named_weights()
    if rank == 0:
        assert weights is not None
        torch.save(dict(weights), out)
    engine.close()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_split_megatron_checkpoint_exports_the_engines_weights(layout, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    world, parallel = LAYOUTS[layout]
    model_dir = _build(layout, tmp_path / "m")
    step = tmp_path / "run" / "checkpoints" / "step_000001"
    mp.set_forkserver_preload(PRELOAD)
    args = (world, parallel, str(model_dir), free_port(), str(step), str(tmp_path / "w.pt"))
    mp.start_processes(_save_worker, args=args, nprocs=world, join=True, start_method="forkserver")
    # what is on disk: one file per rank, each with its share of the model
    assert sorted(p.name for p in (step / "policy").glob("rank*.pt")) == [
        f"rank{r}.pt" for r in range(world)
    ]
    engine_weights = torch.load(tmp_path / "w.pt")

    out = tmp_path / "hf"
    cmd = [sys.executable, "-m", "rlpost.export", str(step), str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]

    saved, base = _tensors(out), _tensors(model_dir)
    tied = AutoConfig.from_pretrained(model_dir).tie_word_embeddings
    # tied embeddings: the files hold the embedding once, the engine also sends lm_head
    assert saved.keys() == engine_weights.keys() - ({"lm_head.weight"} if tied else set())
    for name, tensor in saved.items():
        assert torch.equal(tensor, engine_weights[name]), name
    assert any(not torch.equal(base[k], saved[k]) for k in saved)  # the SFT step moved them
    model = AutoModelForCausalLM.from_pretrained(out)  # loads in transformers
    head = saved["model.embed_tokens.weight" if tied else "lm_head.weight"]
    assert torch.equal(model.lm_head.weight, head)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.get_vocab() == AutoTokenizer.from_pretrained(model_dir).get_vocab()


def _tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the directory's safetensors files, under the files' names."""
    from safetensors.torch import load_file

    return {k: v for f in sorted(model_dir.glob("*.safetensors")) for k, v in load_file(f).items()}
