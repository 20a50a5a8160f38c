"""The old workload: rlpost's warmed-up built-in `tiny` model (~1 M parameters)
on the built-in task, ~3.5-token completions, 8x8 and 32x8 samples, repeats
in alternating order (bench/README.md)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from trl_compare.common import (
    REPO,
    RUNS,
    TRL_VENV,
    Batch,
    Setup,
    describe_source,
    load_average,
    psutil_total_gib,
    trl_python,
)
from trl_compare.report import (
    KINDS,
    TRL_1,
    gib,
    old_summary,
    report,
    summarize,
    write_json,
    write_section,
)
from trl_compare.sides import prepare, run_raw, run_rlpost, run_trl
from trl_compare.workers import greedy_accuracy


def run_old(args: argparse.Namespace, command: str) -> None:
    """Every run of the old workload; rewrites its section of RESULTS.md and its JSON object."""
    batches = [Batch(*map(int, x.split("x"))) for x in args.batches.split(",")]
    setup = Setup(args.steps, args.repeats, args.max_tokens, 1.0, args.lr, args.micro_batch)

    import psutil  # noqa: F401  (fail here, not in the monitor thread)

    start = time.perf_counter()
    load_before = load_average()
    run_dir = RUNS / (time.strftime("%Y%m%d-%H%M%S") + "-old")
    run_dir.mkdir(parents=True)
    (RUNS / ".gitignore").write_text("*\n")
    trl_python()  # create the venv before anything is timed
    data = prepare(run_dir, batches, setup)
    print(f"run dir {run_dir}; model {data['model']} (from {data['model_source']})", flush=True)

    # The limit first, at 1 and 2 torch threads; the faster of each is kept.
    raw: dict[str, Any] = {}
    for threads in (1, 2):
        res = run_raw(data, batches, setup, threads, run_dir)
        print(f"raw (threads={threads}): {res}", flush=True)
        for b in batches:
            if b.name not in res:
                continue
            cur = raw.setdefault(b.name, {"gen_s": float("inf"), "train_s": float("inf")})
            if res[b.name]["gen_s"] < cur["gen_s"]:
                cur.update(
                    gen_s=res[b.name]["gen_s"],
                    gen_tokens=res[b.name]["gen_tokens"],
                    gen_threads=threads,
                )
            if res[b.name]["train_s"] < cur["train_s"]:
                cur.update(train_s=res[b.name]["train_s"], train_threads=threads)

    runs: list[dict[str, Any]] = []
    for b in batches:
        osf_broken = False
        for rep in range(setup.repeats):
            order = list(KINDS)
            if rep % 2:
                order.reverse()
            for kind in order:
                if kind == "rlpost one_step_off" and osf_broken:
                    continue
                # Memory is sampled in repeat 0 only; the other repeats time the steps.
                sampled = rep == 0 or setup.repeats == 1
                run_setup = setup if sampled else dataclasses.replace(setup, mem_every_s=0.0)
                out = run_dir / f"{b.name}-{''.join(c if c.isalnum() else '-' for c in kind)}-{rep}"
                if kind.startswith("TRL"):
                    threads = 1 if kind == TRL_1 else None
                    res = run_trl(data, b, run_setup, threads, out, args.timeout)
                else:
                    mode = kind.split()[1]
                    res = run_rlpost(data, b, run_setup, mode, out, args.timeout)
                res.update(batch=b.name, kind=kind, rep=rep, mem_sampled=sampled)
                if "steps" in res:
                    res["acc"] = greedy_accuracy(
                        res["final_model"], data["model"], data["val_rows"], setup.max_tokens
                    )
                    s = summarize(res, b)
                    print(
                        f"{b.name} {kind} #{rep}: step {s['step_s']:.3f}s, {s['tok_s']:.0f} tok/s, "
                        f"peak PSS {gib(s['peak_pss'])} GiB, acc {s['acc']:.3f} "
                        f"(rlpost's own val {res.get('rlpost_val_acc')}), run {res['wall_s']:.0f}s",
                        flush=True,
                    )
                else:
                    print(
                        f"{b.name} {kind} #{rep}: FAILED (rc {res['rc']}): {res['error']}",
                        flush=True,
                    )
                    osf_broken |= kind == "rlpost one_step_off"
                runs.append(res)
                (run_dir / "runs.jsonl").open("a").write(json.dumps(res) + "\n")

    import torch
    import transformers
    import vllm

    trl_run = next((r for r in runs if "trl_version" in r), {})
    meta = {
        "workload": "old",
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": f"{os.cpu_count()} CPU cores (nproc {len(os.sched_getaffinity(0))}), "
        f"{psutil_total_gib():.0f} GiB RAM, {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}",
        "load_before": load_before,
        "load_after": load_average(),
        "wall_min": (time.perf_counter() - start) / 60,
        "command": command,
        "source": describe_source(),
        "batches": [(b.prompts, b.n) for b in batches],
        "setup": asdict(setup),
        "val_rows": len(data["val_rows"]),
        "versions": f"torch {torch.__version__}, transformers {transformers.__version__} "
        f"and vLLM {vllm.__version__} (rlpost); TRL {trl_run.get('trl_version', '?')} with "
        f"transformers {trl_run.get('transformers_version', '?')} in {TRL_VENV.relative_to(REPO)}",
        "base_acc": greedy_accuracy(
            data["model"], data["model"], data["val_rows"], setup.max_tokens
        ),
    }
    (run_dir / "meta.json").write_text(json.dumps(meta))
    (run_dir / "raw.json").write_text(json.dumps(raw))
    write_old(args.out, args.json_out, meta, runs, raw)
    print(f"wrote {args.out} and {args.json_out}; raw runs in {run_dir}")


def write_old(
    out: Path, json_out: Path, meta: dict[str, Any], runs: list[dict[str, Any]], raw: dict
) -> None:
    text = report(meta, runs, raw)
    write_section(out, "old", text)
    largest = Batch(*meta["batches"][-1])
    write_json(json_out, "old", old_summary(runs, raw, largest, meta))
    print(text)
