"""The GRPO run check: the real CLI, two steps, on user data files and a user reward.

One run decides three columns: ``vllm`` (the rollout loaded and generated, and
its log-probs equal the trainer's before any sync), ``sync`` (equal again after
a weight sync) and ``grpo`` (the steps ran, loss and gradients finite, the
weights moved). The check reads the run's exit code, output and metrics.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from rlpost.support.checks import engine_parity
from rlpost.support.common import (
    GRPO_STEPS,
    MAX_GAP,
    STEPS,
    TRAIN_TEXTS,
    VAL_TEXTS,
    CheckFailed,
    Outcome,
    cli_error,
    describe,
    failed,
    model_dir,
    passed,
    prompt_row,
    run_dir,
    skipped,
)
from rlpost.support.vl import image_row, is_vl, vision_change, with_cause, write_image

# A reward that differs between almost any two completions, so every group of
# samples has a non-zero advantage and the policy moves.
REWARD_PY = "def score(completion, row):\n    return (sum(map(ord, completion)) % 101) / 100\n"


def cli_command(work: Path, images: bool = False) -> list[str]:
    """``python -m rlpost.main`` on the built model with user files and reward;
    ``images``: every prompt holds an image (a PNG file beside the data)."""
    data = work / "data"
    data.mkdir(exist_ok=True)
    for name, texts in (("train", TRAIN_TEXTS), ("val", VAL_TEXTS)):
        rows = [prompt_row(t) for t in texts]
        if images:  # paths relative to the data file, as a user would write them
            for i, row in enumerate(rows):
                write_image(data / "images" / f"{name}-{i}.png", i)
                rows[i] = image_row(row, f"images/{name}-{i}.png")
        (data / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (data / "reward.py").write_text(REWARD_PY)
    return [
        sys.executable, "-m", "rlpost.main", "algo=grpo",
        f"model.path={model_dir(work)}",
        "data=files",
        f"data.train_files=[{data / 'train.jsonl'}]",
        f"data.val_files=[{data / 'val.jsonl'}]",
        "reward=custom",
        f"reward.fn={data / 'reward.py'}:score",
        "reward.num_workers=0",
        "data.prompts_per_step=2", "rollout.n=4", "rollout.max_tokens=16", "data.val_size=2",
        f"trainer.total_steps={GRPO_STEPS}", "trainer.val_every=0",
        "trainer.lr=1e-3", "trainer.lr_warmup_steps=0",
        "rollout.kv_cache_gib=0.0625",
        # Measure the gap (the sync column) rather than stop the run at it.
        "rollout.max_logprob_gap=null",
        "trainer.logger=[console,jsonl]",
        f"trainer.run_dir={run_dir(work)}",
    ]  # fmt: skip


def failing_part(output: str) -> str:
    """Which check a failed run's error belongs to, from where its traceback went."""
    if "RolloutWorker.load_weights" in output or "RolloutWorker.load_lora" in output:
        return "sync"
    if "RolloutWorker" in output:
        return "vllm"
    if "in save_hf" in output:  # writing run_dir/final after the last step
        return "export"
    return "grpo"


def _finite(row: dict, *keys: str) -> bool:
    return all(k in row and math.isfinite(row[k]) for k in keys)


def step_run(arch: str, work: Path) -> dict[str, Outcome]:
    shutil.rmtree(run_dir(work), ignore_errors=True)
    ray_tmp = Path(tempfile.mkdtemp(prefix="rlpost-ray-", dir="/tmp"))  # short socket paths
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(TQDM_DISABLE="1", RAY_TMPDIR=str(ray_tmp))
    log = work / "run.log"
    try:
        with open(log, "w") as log_file:
            proc = subprocess.run(
                cli_command(work, is_vl(arch)),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=1200,
            )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    metrics = run_dir(work) / "metrics.jsonl"
    rows = []
    if metrics.exists():
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    final = run_dir(work) / "final"
    change = _weight_change(model_dir(work), final) if (final / "config.json").exists() else None
    out = judge_run(proc.returncode, log.read_text(errors="replace"), rows, change)
    for check in ("vllm", "sync"):  # a known cause of a log-prob gap, where there is one
        if out[check].status == "fail" and "log-probs differ" in out[check].text:
            out[check] = failed(with_cause(arch, out[check].text))
    if is_vl(arch) and out["grpo"].status == "pass" and change is not None:
        # model.freeze_vision=true (the default): the language model alone trains.
        tower, _ = vision_change(model_dir(work), final)
        if tower > 0:
            out["grpo"] = failed(f"the frozen vision tower moved by up to {tower:.1e}")
        else:
            text = out["grpo"].text.replace("weights moved", "language model moved")
            out["grpo"] = passed(f"{text}; vision tower unchanged (frozen)")
    if out["vllm"].status == "pass" and 1 not in {r["step"] for r in rows}:
        # The run stopped before logging step 1's gap: measure it on the initial model.
        try:
            gap = engine_parity(model_dir(work), work / "initial")
        except Exception as exc:
            out["vllm"] = failed(describe(exc))
        else:
            if gap > MAX_GAP:
                out["vllm"] = failed(
                    with_cause(arch, f"log-probs differ from transformers' by {gap:.3g}")
                )
            else:
                out["vllm"] = passed(f"log-probs within {gap:.1e} of transformers' (no sync)")
    return out


def judge_run(
    returncode: int, output: str, rows: list[dict], weight_change: float | None
) -> dict[str, Outcome]:
    """The vllm, sync and grpo outcomes of a CLI run, from its exit code, output,
    metrics rows and how far the final weights moved from the initial ones (None:
    no final model). A failed run's error goes to the check it belongs to; the
    checks it kept from being decided are skipped."""
    steps = {int(r["step"]): r for r in rows}
    error = cli_error(output) if returncode else ""
    blame = failing_part(output) if returncode else None
    out: dict[str, Outcome] = {}
    # vllm: validation before step 1 generates with the rollout engine; step 1's
    # samples come from the weights both sides loaded from disk.
    if 1 in steps:
        gap = steps[1]["rollout/logprob_abs_diff_max"]
        if gap > MAX_GAP:
            out["vllm"] = failed(
                f"log-probs differ from the trainer's by {gap:.3g} before any sync"
            )
        else:
            out["vllm"] = passed(f"log-probs within {gap:.1e} of the trainer's before any sync")
    elif 0 in steps and blame != "vllm":
        out["vllm"] = passed("loaded and generated (validation)")
    # sync: every step after the first samples from weights a sync wrote.
    synced = [steps[s]["rollout/logprob_abs_diff_max"] for s in steps if s >= 2]
    if synced:
        gap = max(synced)
        if gap > MAX_GAP:
            out["sync"] = failed(f"log-probs differ from the trainer's by {gap:.3g} after a sync")
        else:
            out["sync"] = passed(f"log-probs within {gap:.1e} of the trainer's after a sync")
    if blame in out:  # that check was decided before the error: the run failed as a whole
        blame = "grpo"
    if blame in ("vllm", "sync"):
        out[blame] = failed(error)
    # grpo: the steps ran, loss and gradients finite, the saved weights moved.
    trained = [steps[s] for s in sorted(steps) if s >= 1]
    bad = [r["step"] for r in trained if not _finite(r, "actor/pg_loss", "actor/grad_norm")]
    if blame == "grpo":
        out["grpo"] = failed(error)
    elif blame in (None, "export"):  # every step ran
        if len(trained) != GRPO_STEPS or bad:
            out["grpo"] = failed(f"{len(trained)} steps logged; non-finite loss or grads in {bad}")
        elif weight_change == 0:
            out["grpo"] = failed("the final weights equal the initial ones")
        else:
            last = trained[-1]
            moved = (
                "no final model"
                if weight_change is None
                else f"weights moved up to {weight_change:.1e}"
            )
            out["grpo"] = passed(
                f"{len(trained)} steps, loss {last['actor/pg_loss']:.3g}, grad norm "
                f"{last['actor/grad_norm']:.3g}; {moved}"
            )
    for part in STEPS["run"]:
        if part not in out:
            out[part] = skipped(f"not reached: the run failed at the {blame} check")
    return out


def _weight_change(initial: Path, final: Path) -> float:
    """Largest absolute change of any tensor the two checkpoints share."""
    from safetensors.torch import load_file

    before = load_file(str(initial / "model.safetensors"))
    after = load_file(str(final / "model.safetensors"))
    if before.keys() != after.keys():
        lost = sorted(before.keys() - after.keys())[:3]
        raise CheckFailed(f"the final model's tensor names differ from the initial's: {lost}")
    return max(float((after[k].float() - before[k].float()).abs().max()) for k in before)
