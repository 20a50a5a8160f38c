"""The built-in base policy: a tiny random model warmed up by a short SFT run.

The warm-up uses the same trainer and data pipeline as ``algo=sft`` and is
cached on disk, keyed by everything that changes its result.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from rlpost.config.groups import Config, ModelConfig, TrainerConfig
from rlpost.data.rows import PromptStream
from rlpost.data.samples import sft_batch
from rlpost.data.tasks import TASKS, build_task
from rlpost.models.vl_inputs import ImageInputs

log = logging.getLogger(__name__)
WARMUP_VERSION = 3
# Built-in vision-language presets: name -> the transformers class built (rlpost.models.vl)
VL_PRESETS = {"tiny_vl": "Qwen2VLForConditionalGeneration"}
PROBE_ROWS = 256


def cache_root(cfg: Config) -> Path:
    if cfg.model.cache_dir:
        return Path(cfg.model.cache_dir).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))
    return Path(base) / "rlpost"


def warmup_task(cfg: Config) -> str:
    """The built-in task the base policy imitates: ``data.name``'s, or arith for user files."""
    return cfg.data.name if cfg.data.name in TASKS else "arith"


def warmup_config(cfg: Config) -> Config:
    """The config the warm-up trains with: the run's preset, warm-up settings, data,
    seed, device and threads, and the defaults for everything else -- one FSDP2 rank,
    float32, full fine-tuning, the default optimizer.

    The cached model then depends only on what ``warmup_key`` names: a LoRA,
    bf16, Megatron or two-rank run that happens to build the cache first builds
    the same model a plain run would.
    """
    t, m = cfg.trainer, cfg.model
    trainer = dataclasses.replace(
        TrainerConfig(),
        world_size=1,
        seed=t.seed,
        device=t.device,
        threads=t.threads,
        num_cpus_per_worker=t.num_cpus_per_worker,
    )
    model = dataclasses.replace(
        ModelConfig(), preset=m.preset, cache_dir=m.cache_dir, warmup=m.warmup
    )
    return dataclasses.replace(cfg, trainer=trainer, model=model)


def warmup_key(cfg: Config) -> str:
    from rlpost.device import resolve_device

    w = cfg.model.warmup
    fields = {
        "version": WARMUP_VERSION,
        "device": resolve_device(cfg.trainer.device).kind,
        "task": warmup_task(cfg),
        "preset": cfg.model.preset,
        "steps": w.steps,
        "batch_size": w.batch_size,
        "lr": w.lr,
        "target_accuracy": w.target_accuracy,
        "eval_every": w.eval_every,
        "max_operand": cfg.data.max_operand,
        "val_size": cfg.data.val_size,
        "seed": cfg.trainer.seed,
    }
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]
    return f"{cfg.model.preset}-{digest}"


def builtin_model(cfg: Config, make_trainer: Callable[[str, float, int], Any]) -> str:
    """Path of the warmed-up tiny model; builds and caches it on first use.

    ``make_trainer(model_path, lr, lr_warmup_steps)`` returns a ``TrainerGroup`` on that
    model, built from ``warmup_config(cfg)``.
    """
    from rlpost.models.tiny import build_tiny_model
    from rlpost.models.vl import build_vl_model

    out = cache_root(cfg) / warmup_key(cfg)
    if (out / "config.json").exists():
        log.info("built-in model: %s (cached)", out)
        return str(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    init_dir = out.with_name(out.name + ".init")
    shutil.rmtree(init_dir, ignore_errors=True)
    if cfg.model.preset in VL_PRESETS:
        build_vl_model(VL_PRESETS[cfg.model.preset], init_dir, seed=cfg.trainer.seed)
    else:
        build_tiny_model(cfg.model.preset, init_dir, seed=cfg.trainer.seed)
    w = cfg.model.warmup
    if w.steps == 0:
        os.replace(init_dir, out)
        return str(out)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(init_dir)
    task = build_task(
        warmup_task(cfg),
        seed=cfg.trainer.seed,
        max_operand=cfg.data.max_operand,
        num_val=cfg.data.val_size,
    )
    rows = task.sft_rows()
    stream = PromptStream(rows, seed=cfg.trainer.seed, batch_size=w.batch_size)
    images = ImageInputs(str(init_dir)) if cfg.model.preset in VL_PRESETS else None
    # Accuracy is probed on training prompts: the held-out set stays unseen.
    probe = sft_batch(tokenizer, rows[:PROBE_ROWS], images)
    trainer = make_trainer(str(init_dir), w.lr, 0)
    try:
        start = time.perf_counter()
        bar = tqdm(range(1, w.steps + 1), desc="warm-up (sft)", unit="step", dynamic_ncols=True)
        accuracy = 0.0
        for step in bar:
            metrics = trainer.update_sft(sft_batch(tokenizer, stream.next_batch(), images))
            if step % w.eval_every == 0:
                accuracy = float(trainer.greedy_match(probe).float().mean())
            bar.set_postfix(nll=f"{metrics['sft/nll']:.3f}", acc=f"{accuracy:.3f}")
            if accuracy >= w.target_accuracy:
                break
        bar.close()
        trainer.save_hf(str(out))
    finally:
        trainer.close()
        shutil.rmtree(init_dir, ignore_errors=True)
    log.info(
        "built-in model: %s (%d warm-up steps in %.0f s, train accuracy %.3f)",
        out, step, time.perf_counter() - start, accuracy,
    )  # fmt: skip
    return str(out)
