"""The realistic workload (issue 13): rlpost's built-in `small` model (30.5 M
parameters, random weights), completions forced to ``--real-tokens`` tokens on
every side, 32 prompts x 8 samples per step.

One run of each side: rlpost sync, rlpost one_step_off, TRL generating with
transformers, TRL generating with its vLLM integration in colocate mode; and
the limit (raw vLLM generation + a raw forward/backward/AdamW step on the same
batch). Held-out accuracy is not measured here: a randomly initialised model
after a few steps scores 0 on the task whatever trains it (the old workload
measures it).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from trl_compare.common import (
    RUNS,
    TRL_VLLM_VENV,
    Batch,
    Setup,
    describe_source,
    load_average,
    psutil_total_gib,
    trl_vllm_python,
)
from trl_compare.report import (
    TARGET_SYNC_LIMIT,
    TARGET_TOKS_RATIO,
    aggregate,
    fmt,
    gib,
    summarize,
    workload_summary,
    write_json,
    write_section,
)
from trl_compare.sides import prepare, run_raw, run_rlpost, run_trl

SYNC, OSF = "rlpost sync", "rlpost one_step_off"
TRL_HF, TRL_VLLM = "TRL, transformers generate", "TRL, vLLM colocate"
SIDES = (SYNC, OSF, TRL_HF, TRL_VLLM)
TARGET_TRL_VLLM = 1.0  # rlpost sync tokens/s >= TRL with vLLM colocate
TARGET_OSF = 1.3  # one_step_off steps/s >= 1.3x sync's
TARGET_SYNC_FRAC = 0.10  # weight sync < 10 % of a sync step
PRECISION_FP32 = "Precision: float32 on every side."
PRECISION_BF16 = (
    "Precision: bf16 compute with float32 master weights on every side: rlpost "
    "`trainer.mixed_precision=bf16` (FSDP2 computes in bf16, and its vLLM rollout follows "
    "into bf16 through `rollout.dtype=auto`), TRL `bf16=True` (its default: autocast around "
    "generation and training), the limit with vLLM in bf16 and training under bf16 autocast. "
    "This CPU has avx512_bf16: a bf16 matmul runs ~3.6x faster than a float32 one."
)
TIMING = ("generate_s", "generate_wait_s", "logprob_s", "update_s", "weight_sync_s", "step_s")


def realistic_setup(args: argparse.Namespace, precision: str) -> tuple[Batch, Setup]:
    if args.quick:  # a smoke run of every side
        setup = Setup(2, 1, 16, 1.0, args.lr, 8, min_tokens=16, model="small", precision=precision)
        return Batch(4, 2), setup
    tokens = args.real_tokens
    setup = Setup(args.real_steps, 1, tokens, 1.0, args.lr, args.micro_batch, min_tokens=tokens,
                  kv_cache_gib=0.5, model="small", mem_every_s=2.0,
                  precision=precision)  # fmt: skip
    return Batch(*map(int, args.real_batch.split("x"))), setup


def section(precision: str) -> str:
    """The workload's section of RESULTS.md (its key in compare_trl.json has ``_``)."""
    return "realistic" if precision == "float32" else "realistic-bf16"


def run_realistic(args: argparse.Namespace, command: str) -> None:
    """Every side once per ``--real-precision``; each rewrites its section of RESULTS.md
    and its JSON object."""
    for precision in args.real_precision.split(","):
        run_realistic_at(args, command, precision)


def run_realistic_at(args: argparse.Namespace, command: str, precision: str) -> None:
    import psutil  # noqa: F401  (fail here, not in the monitor thread)

    b, setup = realistic_setup(args, precision)
    start = time.perf_counter()
    load_before = load_average()
    run_dir = RUNS / (time.strftime("%Y%m%d-%H%M%S") + "-" + section(precision))
    run_dir.mkdir(parents=True)
    (RUNS / ".gitignore").write_text("*\n")
    trl_vllm_python()  # create the venv before anything is timed
    data = prepare(run_dir, [b], setup)
    print(f"run dir {run_dir}; model {data['model']}", flush=True)

    # The limit at 1 and 2 torch threads, before the sides; the faster of each half.
    limits = [measure_limit(data, b, setup, run_dir / f"raw-t{t}", t) for t in (1, 2)]

    runs: list[dict[str, Any]] = []
    for kind in (SYNC, TRL_HF, OSF, TRL_VLLM):  # the targets' main sides first
        out = run_dir / "".join(c if c.isalnum() else "-" for c in kind)
        load = load_average()
        if kind.startswith("TRL"):
            # torch's default threads (every core), as a TRL user runs it; rlpost runs
            # with its default trainer.threads=auto
            r = run_trl(data, b, setup, None, out, args.timeout, "trl-vllm", kind == TRL_VLLM)
        else:
            r = run_rlpost(data, b, setup, kind.split()[1], out, args.timeout)
        r.update(batch=b.name, kind=kind, rep=0, load_before=load, load_after=load_average())
        if "steps" in r:
            s = summarize(r, b)
            print(f"{kind}: step {s['step_s']:.3f}s, {s['tok_s']:.0f} tok/s, "
                  f"{s['tokens'] / b.samples:.1f} tokens/completion, peak PSS "
                  f"{gib(s['peak_pss'])} GiB, run {r['wall_s']:.0f}s", flush=True)  # fmt: skip
        else:
            print(f"{kind}: FAILED (rc {r['rc']}): {r['error']}", flush=True)
        runs.append(r)
        with (run_dir / "runs.jsonl").open("a") as f:
            f.write(json.dumps(r) + "\n")

    raw = combine_limits(b, limits)
    raw_error = next((m["error"] for m in limits if "error" in m), None) if not raw else None

    import torch
    import transformers
    import vllm

    trl_run = next((r for r in runs if "trl_version" in r), {})
    meta = {
        "workload": section(precision),
        "precision": precision,
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": f"{psutil_total_gib():.0f} GiB RAM, "
        f"{platform.processor() or platform.machine()}, Python {platform.python_version()}",
        "load_before": load_before,
        "load_after": load_average(),
        "wall_min": (time.perf_counter() - start) / 60,
        "command": command,
        "source": describe_source(),
        "batches": [(b.prompts, b.n)],
        "setup": asdict(setup),
        "raw_error": raw_error,
        "trl_threads": trl_run.get("torch_threads"),
        "versions": f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"vLLM {vllm.__version__}; TRL {trl_run.get('trl_version', '?')} in "
        f"bench/{TRL_VLLM_VENV.name} (rlpost's packages + TRL)",
    }
    (run_dir / "meta.json").write_text(json.dumps(meta))
    (run_dir / "raw.json").write_text(json.dumps(raw))
    write_realistic(args, meta, runs, raw)
    print(f"wrote {args.out} and {args.json_out}; raw runs in {run_dir}")


def measure_limit(data: dict, b: Batch, setup: Setup, out: Path, threads: int) -> dict[str, Any]:
    """Raw generation and training of the batch at ``threads`` torch threads, and the
    load around it."""
    out.mkdir(parents=True)
    before = load_average()
    res = run_raw(data, [b], setup, threads, out, gen_repeats=3, train_repeats=1)
    print(f"raw (threads={threads}): {res}", flush=True)
    if b.name not in res:
        return {"error": res.get("error", "no result"), "threads": threads}
    return {**res[b.name], "threads": threads, "load_before": before, "load_after": load_average()}


def combine_limits(b: Batch, limits: list[dict[str, Any]]) -> dict[str, Any]:
    """The limit is the faster of the measurements of each half (each was possible on
    this machine); all of them stay under ``measurements``."""
    ok = [m for m in limits if "error" not in m]
    if not ok:
        return {}
    gen = min(ok, key=lambda m: m["gen_s"])
    train = min(ok, key=lambda m: m["train_s"])
    return {
        b.name: {
            "gen_s": gen["gen_s"],
            "gen_tokens": ok[0]["gen_tokens"],
            "train_s": train["train_s"],
            "gen_threads": gen.get("threads", 1),
            "train_threads": train.get("threads", 1),
            "measurements": limits,
        }
    }


def trl_vllm_failure(error: str) -> str:
    """Why TRL's vLLM colocate side failed, when the reason is the known one."""
    if "weight_loader" not in error:
        return ""
    return (
        "TRL's colocate weight sync (`VLLMGeneration.sync_weights`) calls the live vLLM "
        "model's `load_weights`; vLLM's CPU build processes the linear layers' weights after "
        "loading, and the processed parameters no longer carry the `weight_loader` that "
        "`load_weights` needs. vLLM's CPU build reloads weights only through "
        "`model_runner.reload_weights` (what rlpost's worker extension calls, DESIGN.md). "
        "TRL syncs before its first generation, so it fails before generating anything; "
        "TRL 1.16 also warns that it supports vLLM 0.22-0.31, and vLLM's CPU build is 0.32."
    )


def write_realistic(
    args: argparse.Namespace, meta: dict[str, Any], runs: list[dict[str, Any]], raw: dict
) -> None:
    b = Batch(*meta["batches"][0])
    agg = {kind: aggregate(runs, b, kind) for kind in SIDES}
    ok = {k: m for k, m in agg.items() if isinstance(m, dict)}
    vllm_err = agg[TRL_VLLM] if isinstance(agg[TRL_VLLM], str) else None
    summary = workload_summary(
        sync=ok.get(SYNC),
        one_step_off=ok.get(OSF),
        trl_hf=ok.get(TRL_HF),
        trl_vllm=ok.get(TRL_VLLM),
        trl_vllm_reason=f"TRL with vLLM colocate failed: {vllm_err}. {trl_vllm_failure(vllm_err)}"
        if vllm_err
        else None,
        limit=raw.get(b.name),
        extra={
            "batch": b.name,
            "model": "built-in small (Qwen2, 30.5 M parameters, random weights)",
            "completion_tokens": meta["setup"]["min_tokens"],
            "precision": meta.get("precision", "float32"),
            "date": meta["date"],
            "load_before": meta["load_before"],
            "load_after": meta["load_after"],
            "source": meta["source"],
            "held_out_accuracy": None,
            "held_out_accuracy_reason": "a randomly initialised model scores 0 after a few "
            "steps whatever trains it; see the old workload",
        },
    )
    loads = {
        r["kind"]: f"{r['load_before'].split()[0]} -> {r['load_after'].split()[0]}"
        for r in runs
        if "load_before" in r
    }
    text = realistic_report(meta, agg, raw.get(b.name), summary, loads)
    name = section(meta.get("precision", "float32"))
    write_section(args.out, name, text)
    write_json(args.json_out, name.replace("-", "_"), summary)
    print(text)


def realistic_report(
    meta: dict[str, Any],
    agg: dict[str, dict[str, float] | str],
    lim: dict[str, Any] | None,
    summary: dict[str, Any],
    loads: dict[str, str],
) -> str:
    s = meta["setup"]
    b = Batch(*meta["batches"][0])
    bf16 = meta.get("precision") == "bf16"
    lines = [
        f"## Realistic workload{', bf16' if bf16 else ''}: the built-in `small` model, "
        f"{s['min_tokens']}-token completions, {b.name} samples",
        "",
        PRECISION_BF16 if bf16 else PRECISION_FP32,
        "",
        f"Written by `bench/compare_trl.py` (`--workload realistic`). Measured {meta['date']} "
        f"on 2 CPU cores ({meta['machine']}); load average (1, 5, 15 min) "
        f"{meta['load_before']} before the run and {meta['load_after']} after (the run itself "
        "keeps both cores busy: a load near 2 means nothing else ran). Total wall time "
        f"{meta['wall_min']:.1f} min. rlpost under test: {meta['source']}. "
        f"Versions: {meta['versions']}.",
        "",
        "Every side starts from the same files: rlpost's built-in `small` preset (Qwen2, "
        "8 layers, hidden 512, 30.5 M parameters, random weights, seed 0), built once and "
        "loaded from one directory, and takes the built-in task's prompts in rlpost's order. "
        f"{s['steps']} GRPO steps per side (step 1 excluded from the medians as warm-up), "
        f"{b.prompts} prompts x {b.n} samples, temperature {s['temperature']}, lr {s['lr']} "
        f"(constant), AdamW betas (0.9, 0.99), gradient clipping 1.0, micro-batches of "
        f"{s['micro_batch']}, clipped ratio 0.2, group-normalised advantages, token-mean over "
        "the global batch, no KL. Completion lengths are forced, the same on every side: "
        f"at least and at most {s['min_tokens']} tokens (rlpost `rollout.min_tokens` = "
        "`rollout.max_tokens`, vLLM `SamplingParams(min_tokens=...)`; TRL "
        "`generation_kwargs={'min_new_tokens': ...}` with transformers and `{'min_tokens': ...}` "
        "with vLLM). Each side runs with its defaults: TRL in one process with torch's default "
        f"threads ({meta.get('trl_threads', 'the machine cores')}); rlpost's trainer and vLLM "
        "replica are two Ray actors with `trainer.threads=auto` (sync: each uses both cores "
        "in its turn; one_step_off: one core each, as they run at once). TRL's vLLM side "
        "has `vllm_importance_sampling_correction=False` (on by default it adds an old-log-prob "
        "forward and reweights the loss; rlpost's sync loss has neither).",
        "",
        "load: the 1-minute load average when the run started and ended (2 cores).",
        "",
        "| run | step s | gen tokens/s | tokens/completion | peak mem GiB (PSS, RSS) | "
        "where the step goes (medians, s) | load |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for kind in SIDES:
        m = agg[kind]
        if isinstance(m, str):
            lines.append(
                f"| {kind} | failed: {m[:300]} | | | | | {loads.get(kind, 'not recorded')} |"
            )
            continue
        parts = ", ".join(f"{k}={m['t_' + k]:.2f}" for k in TIMING if "t_" + k in m)
        lines.append(
            f"| {kind} | {m['step_s']:.2f} | {fmt(m['tok_s'], 0)} | "
            f"{m['tokens'] / b.samples:.1f} | {gib(m['peak_pss'])}, {gib(m['peak_rss'])} | "
            f"{parts} | {loads.get(kind, 'not recorded')} |"
        )
    for m in (lim or {}).get("measurements", []):
        when = f"at {m['threads']} torch thread(s)" if "threads" in m else "(one thread)"
        if "error" in m:
            lines.append(f"| limit measured {when} | failed: {m['error']} | | | | | |")
            continue
        lines.append(
            f"| limit measured {when} | {m['gen_s']:.2f} + {m['train_s']:.2f} | | | | "
            f"| {m['load_before'].split()[0]} -> {m['load_after'].split()[0]} |"
        )
    if lim:
        gen, train = lim["gen_s"], lim["train_s"]
        lines.append(
            f"| limit: raw gen + raw train | {gen:.2f} + {train:.2f} = {gen + train:.2f} | "
            f"{lim['gen_tokens'] / (gen + train):.0f} (gen alone {lim['gen_tokens'] / gen:.0f}) | "
            f"{lim['gen_tokens'] / b.samples:.1f} | | the faster measurement of each half "
            f"(gen at {lim['gen_threads']}, train at {lim['train_threads']} thread(s)) | |"
        )
    else:
        lines.append(f"| limit | failed: {meta.get('raw_error')} | | | | | |")
    lines += ["", "### Targets", "", "| target | measured | verdict |", "| --- | --- | --- |"]
    lines += _targets(summary)
    lines += ["", "### Notes", "", *_notes(meta, agg, lim, summary, b)]
    return "\n".join(lines) + "\n"


def _verdict(x: float | None, target: float, at_least: bool) -> str:
    if x is None:
        return "not measured"
    if (x >= target) if at_least else (x <= target):
        return "met"
    return f"missed by {target / x:.2f}x" if at_least else f"missed by {x / target:.2f}x"


def _x(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def _targets(sm: dict[str, Any]) -> list[str]:
    hf, vl = sm["rlpost_sync_vs_trl_hf_tok_s"], sm["rlpost_sync_vs_trl_vllm_tok_s"]
    lim, osf, ws = sm["sync_step_over_limit"], sm["one_step_off_speedup"], sm["weight_sync_frac"]
    pct = "n/a" if ws is None else f"{100 * ws:.1f} %"
    ws_verdict = (
        "not measured"
        if ws is None
        else "met"
        if ws < TARGET_SYNC_FRAC
        else f"missed by {ws / TARGET_SYNC_FRAC:.2f}x"
    )
    return [
        f"| rlpost sync gen tokens/s >= {TARGET_TOKS_RATIO:g}x TRL (transformers generate) | "
        f"{_x(hf)} | {_verdict(hf, TARGET_TOKS_RATIO, True)} |",
        f"| rlpost sync gen tokens/s >= {TARGET_TRL_VLLM:g}x TRL (vLLM colocate) | {_x(vl)} | "
        f"{_verdict(vl, TARGET_TRL_VLLM, True) if vl is not None else 'not measured: TRL with vLLM failed'} |",
        f"| rlpost sync step <= {TARGET_SYNC_LIMIT:g}x (raw gen + raw train) | {_x(lim)} | "
        f"{_verdict(lim, TARGET_SYNC_LIMIT, False)} |",
        f"| one_step_off steps/s >= {TARGET_OSF:g}x sync's | {_x(osf)} | "
        f"{_verdict(osf, TARGET_OSF, True)} |",
        f"| weight sync < {100 * TARGET_SYNC_FRAC:.0f} % of a sync step | {pct} | {ws_verdict} |",
        "| held-out accuracy no worse than TRL's | not measured | a random 30 M model scores 0 "
        "after a few steps on any side; the old workload's table measures it |",
    ]


def _notes(
    meta: dict[str, Any],
    agg: dict[str, dict[str, float] | str],
    lim: dict[str, Any] | None,
    sm: dict[str, Any],
    b: Batch,
) -> list[str]:
    notes: list[str] = []
    sync, osf, hf, vl = (agg[k] for k in SIDES)
    if isinstance(sync, dict) and lim:
        gen, train = lim["gen_s"], lim["train_s"]
        rest = sync["step_s"] - sum(
            sync.get(f"t_{k}", 0.0) for k in ("generate_s", "update_s", "weight_sync_s")
        )
        notes.append(
            f"- {b.name}, rlpost sync: step {sync['step_s']:.1f} s against a limit of "
            f"{gen + train:.1f} s. Generation {sync['t_generate_s']:.1f} s (raw vLLM {gen:.1f} s), "
            f"update {sync['t_update_s']:.1f} s (raw forward+backward+AdamW {train:.1f} s), "
            f"weight sync {sync.get('t_weight_sync_s', float('nan')):.2f} s, the rest (scoring, "
            f"batching, advantages, logging) {rest:.2f} s. The limit and each side ran one "
            "after another; the load column says whether anything else shared the cores. "
            "Within one run, rlpost's own costs are the weight sync and the rest."
        )
    if isinstance(sync, dict) and isinstance(hf, dict):
        notes.append(
            f"- {b.name}, against TRL with transformers: its `model.generate` took "
            f"{hf['t_generate_s']:.2f} s of its {hf['step_s']:.2f} s step, rlpost's generation "
            f"{sync['t_generate_s']:.2f} s ({hf['t_generate_s'] / sync['t_generate_s']:.1f}x "
            f"faster). The update is the same work on both sides (rlpost "
            f"{sync.get('t_update_s', float('nan')):.2f} s, TRL's step minus generation "
            f"{hf['step_s'] - hf['t_generate_s']:.2f} s), so the step ratio is bounded by the "
            "update: with generation free, rlpost's tokens/s could be at most "
            f"{hf['step_s'] / (hf['step_s'] - hf['t_generate_s']):.2f}x TRL's."
        )
    if vl == "not run":
        notes.append("- TRL with vLLM colocate: not run.")
    elif isinstance(vl, str):
        why = trl_vllm_failure(vl)
        notes.append(f"- TRL with vLLM colocate did not run on vLLM's CPU build: `{vl}`. {why}")
    elif isinstance(vl, dict):
        notes.append(
            f"- TRL with vLLM colocate: generation {vl['t_generate_s']:.2f} s, weight sync "
            f"{vl.get('t_weight_sync_s', float('nan')):.2f} s of a {vl['step_s']:.2f} s step."
        )
    if isinstance(sync, dict) and isinstance(osf, dict):
        notes.append(
            f"- one_step_off: step {osf['step_s']:.2f} s against sync's {sync['step_s']:.2f} s. "
            f"Its generation, overlapped with the update, took {osf['t_generate_s']:.2f} s "
            f"(alone: {sync['t_generate_s']:.2f} s) and the update {osf['t_update_s']:.2f} s "
            f"(alone: {sync['t_update_s']:.2f} s). With perfect overlap the step would be "
            f"max(gen, update) = {max(sync['t_generate_s'], sync['t_update_s']):.2f} s: the "
            "speed-up one_step_off can give is bounded by how much of the step generation is, "
            "and the two halves share the two cores."
        )
        ones = [m for m in (lim or {}).get("measurements", [])
                if m.get("threads") == 1 and "error" not in m]  # fmt: skip
        if lim and ones:
            one = ones[0]
            packed = (one["gen_s"] + one["train_s"]) / 2
            notes[-1] += (
                f" On two cores the best overlapped schedule runs each half at one thread, "
                f"side by side, perfectly packed: (raw gen {one['gen_s']:.1f} s + raw train "
                f"{one['train_s']:.1f} s at one thread) / 2 cores = {packed:.1f} s a step, "
                f"against the sync limit of {lim['gen_s'] + lim['train_s']:.1f} s: at most "
                f"{(lim['gen_s'] + lim['train_s']) / packed:.2f}x, whatever the scheduler, since "
                "both halves already use two threads well in sync mode."
            )
        bound = (sync["t_generate_s"] + sync["t_update_s"]) / max(
            sync["t_generate_s"], sync["t_update_s"]
        )
        if sync["step_s"] / osf["step_s"] > 1.05 * bound:
            notes[-1] += (
                f" At equal load that bound is {bound:.2f}x; the measured "
                f"{sync['step_s'] / osf['step_s']:.2f}x is above it because the one_step_off run "
                f"got more of the machine: the same update took {osf['t_update_s']:.1f} s there "
                f"and {sync['t_update_s']:.1f} s in the sync run."
            )
    notes.append(
        "- Held-out accuracy is not compared here: the model starts from random weights "
        "(no warm-up; 30 M parameters would need a long SFT on two cores) and every side "
        "scores 0 after a few steps. The old workload's table compares it."
    )
    return notes
