"""One run of each side: rlpost (its CLI), TRL (a worker in TRL's venv), and the
raw limit (a worker in rlpost's venv); and the data they all share."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from trl_compare import common
from trl_compare.common import (
    ENTRY,
    REPO,
    SEED,
    Batch,
    Setup,
    rlpost_env,
    run_monitored,
    tail,
    trl_python,
    trl_vllm_python,
)

# -- data and the shared model --------------------------------------------------------------


def prepare(run_dir: Path, batches: list[Batch], setup: Setup) -> dict[str, Any]:
    """Copy rlpost's built-in model into ``run_dir/model``; the prompts of every step.

    A preset without warm-up (``model=small``) is built straight into
    ``run_dir/model`` as rlpost's ``builtin_model`` would build it (same seed).
    """
    from transformers import AutoTokenizer

    from rlpost.config.compose import compose
    from rlpost.data.rows import PromptStream
    from rlpost.data.samples import encode_prompt
    from rlpost.data.tasks.arith import ArithTask
    from rlpost.models.tiny import build_tiny_model
    from rlpost.models.warmup import cache_root, warmup_key

    cfg = compose([f"trainer.seed={SEED}", f"model={setup.model}"])
    cached = cache_root(cfg) / warmup_key(cfg)
    model = run_dir / "model"
    if cfg.model.warmup.steps == 0:
        build_tiny_model(setup.model, model, seed=SEED)
        cached = model
    elif not (cached / "config.json").exists():
        print(f"warming up rlpost's built-in model into {cached} ...", flush=True)
        cmd = [sys.executable, "-m", "rlpost.main", "trainer.total_steps=0",
               f"trainer.run_dir={run_dir / 'warmup'}", "trainer.logger=[jsonl]"]  # fmt: skip
        subprocess.run(cmd, check=True, cwd=common.SRC, env=rlpost_env())
    if cached != model:
        shutil.copytree(cached, model)
    tok = AutoTokenizer.from_pretrained(model)
    task = ArithTask(seed=SEED, max_operand=cfg.data.max_operand, num_val=cfg.data.val_size)
    train_rows, val_rows = task.train_rows(), task.val_rows()
    steps: dict[str, list[list[dict]]] = {}
    for b in batches:
        # The rows rlpost's controller takes at steps 1..N (its stream, its seed).
        stream = PromptStream(train_rows, seed=SEED, batch_size=b.prompts)
        steps[b.name] = [stream.next_batch() for _ in range(max(setup.steps, 8))]
    return {
        "model": str(model),
        "model_source": str(cached),
        "steps": steps,
        "val_rows": val_rows,
        "prompt_ids": {
            name: [[encode_prompt(tok, r) for r in rows] for rows in per_step]
            for name, per_step in steps.items()
        },
    }


# -- one run of each framework --------------------------------------------------------------


def run_rlpost(
    data: dict, b: Batch, setup: Setup, mode: str, out: Path, timeout: float
) -> dict[str, Any]:
    overrides = [
        f"model.path={data['model']}",
        f"data.prompts_per_step={b.prompts}",
        f"rollout.n={b.n}",
        f"rollout.max_tokens={setup.max_tokens}",
        f"rollout.min_tokens={setup.min_tokens}",
        f"rollout.kv_cache_gib={setup.kv_cache_gib}",
        f"rollout.temperature={setup.temperature}",
        f"trainer.lr={setup.lr}",
        "trainer.lr_warmup_steps=0",
        f"trainer.total_steps={setup.steps}",
        "trainer.val_every=0",
        "trainer.save_every=0",  # no checkpoints: the bench keeps the final model only
        f"trainer.micro_batch_size={setup.micro_batch}",
        f"trainer.async_mode={mode}",
        f"trainer.seed={SEED}",
        f"trainer.run_dir={out}",
        "trainer.logger=[jsonl]",
    ]
    if setup.precision == "bf16":  # the rollout follows into bf16 (rollout.dtype=auto)
        overrides.append("trainer.mixed_precision=bf16")
    if setup.min_tokens:
        # vLLM reports the processed log-probs: with the end token masked before
        # min_tokens they differ from the trainer's by log(1 - p_end), which the
        # sync-mode parity check would take for a broken weight sync.
        overrides.append("rollout.max_logprob_gap=null")
    cmd = [sys.executable, "-m", "rlpost.main", *overrides]
    metrics_file = out / "metrics.jsonl"
    rc, mon, wall = run_monitored(
        cmd,
        out.with_suffix(".log"),
        rlpost_env(),
        common.SRC,
        timeout,
        metrics_file,
        setup.mem_every_s,
    )
    result: dict[str, Any] = {"rc": rc, "wall_s": wall, "cmd": " ".join(cmd[1:])}
    result.update(peak_pss=mon.peak_pss, peak_rss=mon.peak_rss, procs=mon.peak_procs)
    rows = (
        [json.loads(x) for x in metrics_file.read_text().splitlines()]
        if metrics_file.exists()
        else []
    )
    if rc != 0 or len(rows) < setup.steps + 1:
        result["error"] = tail(out.with_suffix(".log"))
        return result
    times = mon.line_times  # line k is step k (line 0: the step-0 validation)
    steps = []
    for k in range(1, setup.steps + 1):
        row = rows[k]
        wall_k = times[k] - times[k - 1] - row.get("timing/val_s", 0.0)
        tokens = row["response/length_mean"] * b.samples
        steps.append({
            "wall_s": wall_k,
            "tokens": tokens,
            "reward": row["reward/mean"],
            **{key: v for key, v in row.items() if key.startswith("timing/")},
        })  # fmt: skip
    result.update(steps=steps, final_model=str(out / "final"))
    result["rlpost_val_acc"] = rows[-1].get("val/accuracy")
    return result


def run_trl(
    data: dict,
    b: Batch,
    setup: Setup,
    threads: int | None,
    out: Path,
    timeout: float,
    venv: str = "trl",
    use_vllm: bool = False,
) -> dict[str, Any]:
    """TRL's GRPOTrainer; ``threads=None`` keeps torch's default.

    ``venv``: "trl" runs in bench/.venv-trl (TRL's own pick of transformers),
    "trl-vllm" in bench/.venv-trl-vllm (rlpost's torch, transformers and vLLM);
    ``use_vllm`` generates with TRL's vLLM integration in colocate mode.
    """
    out.mkdir(parents=True)
    spec = {
        "model": data["model"],
        "rows": [r for rows in data["steps"][b.name][: setup.steps] for r in rows],
        "arith_py": str(common.SRC / "rlpost" / "data" / "tasks" / "arith.py"),
        "prompts": b.prompts,
        "n": b.n,
        "setup": asdict(setup),
        "out": str(out),
        "threads": threads,
        "use_vllm": use_vllm,
    }
    (out / "spec.json").write_text(json.dumps(spec))
    python = trl_vllm_python() if venv == "trl-vllm" else trl_python()
    cmd = [str(python), str(ENTRY), "--trl-worker", str(out / "spec.json")]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    if use_vllm:
        # vLLM's CPU KV cache is sized in whole GiB by this variable (TRL passes no size).
        env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(setup.kv_cache_gib)))
        env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    log = out.with_suffix(".log")
    rc, mon, wall = run_monitored(cmd, log, env, REPO, timeout, None, setup.mem_every_s)
    result: dict[str, Any] = {"rc": rc, "wall_s": wall, "peak_pss": mon.peak_pss}
    result.update(peak_rss=mon.peak_rss, procs=mon.peak_procs)
    if rc != 0 or not (out / "result.json").exists():
        result["error"] = tail(out.with_suffix(".log"))
        return result
    result.update(json.loads((out / "result.json").read_text()))
    return result


def run_raw(
    data: dict,
    batches: list[Batch],
    setup: Setup,
    threads: int,
    out: Path,
    gen_repeats: int = 5,
    train_repeats: int = 5,
) -> dict:
    """Raw vLLM generation and raw forward+backward at ``threads`` torch threads
    (one warm-up each, then the median of ``gen_repeats`` / ``train_repeats``)."""
    spec = {
        "model": data["model"],
        "threads": threads,
        "setup": asdict(setup),
        "batches": {b.name: {"n": b.n, "prompt_ids": data["prompt_ids"][b.name]} for b in batches},
        "repeats": gen_repeats,
        "train_repeats": train_repeats,
    }
    path = out / f"raw-t{threads}.json"
    path.write_text(json.dumps(spec))
    env = rlpost_env()
    env.update(OMP_NUM_THREADS=str(threads), VLLM_ENABLE_V1_MULTIPROCESSING="0")
    env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    cmd = [sys.executable, str(ENTRY), "--raw-worker", str(path)]
    log = out / f"raw-t{threads}.log"
    with open(log, "w") as f:
        rc = subprocess.run(
            cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=common.SRC
        ).returncode
    result_path = path.with_suffix(".out.json")
    if rc != 0 or not result_path.exists():
        return {"error": tail(log)}
    return json.loads(result_path.read_text())
