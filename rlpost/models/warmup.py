"""The built-in base policy: a tiny random model warmed up by a short SFT run.

The warm-up uses the same trainer and data pipeline as ``algo=sft`` and is
cached on disk, keyed by everything that changes its result and nothing else.
It trains on a built-in task: the run's own, or for a user's files the one that
fits the preset (shapes for a vision-language model, arith for a text one).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from tqdm import tqdm

from rlpost.config.groups import Config, ModelConfig, TrainerConfig
from rlpost.data.rows import PromptStream
from rlpost.data.samples import sft_batch
from rlpost.data.tasks import TASKS, VISION_TASKS, build_task, task_name
from rlpost.models.vl_inputs import ImageInputs

if TYPE_CHECKING:
    from rlpost.workers.trainer_worker import TrainerGroup

log = logging.getLogger(__name__)
# Bumped when the warm-up's procedure changes; 4: task arguments that cannot change
# the training rows (a user's data.val_size, shapes' held-out count) left the key;
# 5: the arith and calc bases ship (a cache warmed up before is not reused for them).
WARMUP_VERSION = 5
# Built-in vision-language presets: name -> the transformers class built (rlpost.models.vl)
VL_PRESETS = {"tiny_vl": "Qwen2VLForConditionalGeneration"}
PROBE_ROWS = 256
WARMUP_RECORD = "warmup.json"  # how the cached model's warm-up ended
# Pre-warmed bases shipped with rlpost, one folder per cache key (rlpost.models.ship
# builds them). The warm-up's float rounding differs between CPUs -- AVX2 and AVX-512
# kernels round differently, and an SFT run that stops at a target accuracy turns that
# into a different base (held-out accuracy 0.330 to 0.445 from one seed) -- so a run
# whose key is shipped starts from the same weights on every machine.
SHIPPED_DIR = Path(__file__).parent / "bases"


def cache_root(cfg: Config) -> Path:
    if cfg.model.cache_dir:
        return Path(cfg.model.cache_dir).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))
    return Path(base) / "rlpost"


def warmup_task(cfg: Config) -> str:
    """The built-in task the base policy imitates: the run's own built-in task when it
    suits the preset, else shapes for a vision-language preset and arith for a text
    one (a user's files; a text task under ``tiny_vl``)."""
    vision = cfg.model.preset in VL_PRESETS
    own = task_name(cfg.data.name)  # data=arith_pref: the arith task's rows
    if own in TASKS and (own in VISION_TASKS) == vision:
        return own
    return "shapes" if vision else "arith"


class WarmupRecord(TypedDict):
    """How a warm-up ended (``warmup.json``)."""

    task: str
    steps: int
    max_steps: int
    accuracy: float
    target_accuracy: float


def warmup_task_args(cfg: Config) -> dict[str, int]:
    """The warm-up task's arguments, only those its training rows depend on
    (``SFT_FIELDS``). The run's own task is built as the run builds it, so the
    warm-up never trains on the run's held-out rows; a task the run does not use is
    built with its defaults, so ``data.*`` keys meant for the user's files do not
    change the built-in model."""
    name = warmup_task(cfg)
    args: dict[str, int | None] = {"seed": cfg.trainer.seed}
    if name == task_name(cfg.data.name):
        args |= {"max_operand": cfg.data.max_operand, "num_val": cfg.data.val_size}
    else:
        # A task the run does not use (a user's files) counts with the defaults the
        # built-in task's own run has: both get one base, the shipped one if any.
        args |= {"max_operand": _default(name, "max_operand"), "num_val": _default(name, "num_val")}
    return {k: v for k, v in args.items() if k in TASKS[name].SFT_FIELDS and v is not None}


def _default(task: str, name: str) -> int | None:
    """The default of field ``name`` of the built-in ``task`` (None where it has none;
    every field of a built-in task is a whole number)."""
    for f in dataclasses.fields(TASKS[task]):
        if f.name == name and isinstance(f.default, int):
            return f.default
    return None


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
        "task_args": warmup_task_args(cfg),
        "preset": cfg.model.preset,
        "steps": w.steps,
        "batch_size": w.batch_size,
        "lr": w.lr,
        "target_accuracy": w.target_accuracy,
        "eval_every": w.eval_every,
        "seed": cfg.trainer.seed,
    }
    if not w.shipped:  # warmed up here: never the shipped copy of the same settings
        fields["warmed_here"] = True
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]
    return f"{cfg.model.preset}-{digest}"


def builtin_model(cfg: Config, make_trainer: Callable[[str, float, int], TrainerGroup]) -> str:
    """Path of the warmed-up tiny model; builds and caches it on first use.

    ``make_trainer(model_path, lr, lr_warmup_steps)`` returns a ``TrainerGroup`` on that
    model, built from ``warmup_config(cfg)``. A warm-up that stops short of
    ``model.warmup.target_accuracy`` is warned about, again whenever the cached
    model is reused (its figures are kept in ``warmup.json`` beside it).
    """
    from rlpost.models.tiny import build_tiny_model
    from rlpost.models.vl import build_vl_model

    if task_name(cfg.data.name) not in TASKS:
        log.warning(
            "model.path is not set: this run trains the built-in %s, a toy model of a few "
            "million parameters warmed up on the built-in %s task, not on your data; pass "
            "model.path=<a Hugging Face model directory> to train a model of your own",
            cfg.model.preset, warmup_task(cfg),
        )  # fmt: skip
    out = cache_root(cfg) / warmup_key(cfg)
    if (out / "config.json").exists():
        log.info("built-in model: %s (cached)", out)
        if (out / WARMUP_RECORD).exists():
            warn_if_short(json.loads((out / WARMUP_RECORD).read_text()))
        return str(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if cfg.model.warmup.shipped and (SHIPPED_DIR / out.name / "config.json").exists():
        return install_shipped(SHIPPED_DIR / out.name, out)
    log.warning(
        "built-in model: no pre-warmed base ships for these settings; warming one up here "
        "(up to %d SFT steps on the built-in %s task, minutes on a CPU), cached in %s for "
        "later runs",
        cfg.model.warmup.steps, warmup_task(cfg), out,
    )  # fmt: skip
    # One initial model per build: two runs that build the same entry at once
    # (two experiments on one machine) each warm their own copy, and the second
    # to finish replaces the first's with the same model (``save_hf`` is atomic).
    init_dir = Path(tempfile.mkdtemp(prefix=f"{out.name}.init-", dir=out.parent))
    if cfg.model.preset in VL_PRESETS:
        build_vl_model(VL_PRESETS[cfg.model.preset], init_dir, seed=cfg.trainer.seed)
    else:
        build_tiny_model(cfg.model.preset, init_dir, seed=cfg.trainer.seed)
    w = cfg.model.warmup
    if w.steps == 0:
        try:
            os.replace(init_dir, out)
        except OSError:  # another run's copy got there first
            shutil.rmtree(init_dir, ignore_errors=True)
        return str(out)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(init_dir)
    task = build_task(warmup_task(cfg), **warmup_task_args(cfg))
    rows = task.sft_rows()
    stream = PromptStream(rows, seed=cfg.trainer.seed, batch_size=w.batch_size)
    images = ImageInputs(str(init_dir)) if cfg.model.preset in VL_PRESETS else None
    # Accuracy is probed on training prompts: the held-out set stays unseen.
    probe = sft_batch(tokenizer, rows[:PROBE_ROWS], images)
    try:
        trainer = make_trainer(str(init_dir), w.lr, 0)
    except BaseException:
        shutil.rmtree(init_dir, ignore_errors=True)
        raise
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
        if step % w.eval_every:  # the steps ran out between two checks: the final figure
            accuracy = float(trainer.greedy_match(probe).float().mean())
        bar.close()
        trainer.save_hf(str(out))
    finally:
        trainer.close()
        shutil.rmtree(init_dir, ignore_errors=True)
    log.info(
        "built-in model: %s (%d warm-up steps in %.0f s, train accuracy %.3f)",
        out, step, time.perf_counter() - start, accuracy,
    )  # fmt: skip
    record: WarmupRecord = {
        "task": warmup_task(cfg),
        "steps": step,
        "max_steps": w.steps,
        "accuracy": accuracy,
        "target_accuracy": w.target_accuracy,
    }
    (out / WARMUP_RECORD).write_text(json.dumps(record))
    warn_if_short(record)
    return str(out)


def install_shipped(shipped: Path, out: Path) -> str:
    """Copy the shipped base ``shipped`` to the cache entry ``out`` (atomically: a
    copy beside it, then a rename; a run that got there first keeps its copy)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"{out.name}.shipped-", dir=out.parent))
    shutil.copytree(shipped, tmp, dirs_exist_ok=True)
    try:
        os.replace(tmp, out)
    except OSError:  # another run installed it first: the same files
        shutil.rmtree(tmp, ignore_errors=True)
    record = json.loads((out / WARMUP_RECORD).read_text())
    log.info(
        "built-in model: %s (the pre-warmed weights shipped with rlpost, the same on every "
        "machine: %d warm-up steps, train accuracy %.3f; model.warmup.shipped=false warms "
        "up here instead)", out, record["steps"], record["accuracy"],
    )  # fmt: skip
    warn_if_short(record)
    return str(out)


def warn_if_short(record: WarmupRecord) -> bool:
    """Warn, with the figures, when the warm-up ``record`` ended below its target
    accuracy; True when it did."""
    if record["accuracy"] >= record["target_accuracy"]:
        return False
    log.warning(
        "the built-in model's warm-up on the %s task reached train accuracy %.3f of its "
        "target %.3f after %d steps: the base policy may not answer in the task's form "
        "yet, and RL from it can score 0 at every step; raise model.warmup.steps (now %d) "
        "or pass model.path=<a Hugging Face model directory>",
        record["task"], record["accuracy"], record["target_accuracy"], record["steps"],
        record["max_steps"],
    )  # fmt: skip
    return True
