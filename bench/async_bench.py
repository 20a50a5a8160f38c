"""sync, one_step_off and fully_async side by side, on two workloads where synchrony costs.

    python bench/async_bench.py                       # both workloads
    python bench/async_bench.py --workload long_tail  # or agent_latency
    python bench/async_bench.py --quick               # a smoke run (3 steps, fewer modes)
    python bench/async_bench.py --report DIR          # rewrite the results from a finished run

Every mode runs the real CLI (``python -m rlpost.main``) with the same seed,
prompts, batch and number of steps, so the same number of samples; one after
another on this machine. The modes: ``sync``, ``one_step_off``, and
``fully_async`` at ``async.max_staleness`` 1, 2 and 4 with partial rollout on,
and at 2 with it off. ``sync`` and ``fully_async`` (2) run again with seed 1:
the difference between the two seeds is the noise the accuracies are read
against.

The workloads:

- ``long_tail``: single-turn completions on the built-in 30 M-parameter
  ``model=small`` (random weights), 16 prompts x 2 samples a step, packed
  micro-batches (``trainer.packing=true``: the update's work is the tokens
  sampled, not the batch padded to its longest sample). Each prompt's
  completion length is drawn from a lognormal with median 16 tokens and a 99th
  percentile 10x that (sigma = ln 10 / 2.326), clipped to [4, 192], and forced
  with the data row's own ``max_tokens`` and ``min_tokens`` columns (so the
  group's samples all have it). ``min_tokens`` makes vLLM's log-probs leave the
  end token out, so the runs set ``rollout.max_logprob_gap=null``. The held-out
  accuracy of random weights is 0 in every mode: reported, not compared.
- ``trl_shape``: the realistic shape of bench/compare_trl.py (``model=small``,
  32 prompts x 8 samples of exactly 100 tokens, micro-batches of 64), where
  the update takes most of a step: whether an overlapping mode is slower than
  not overlapping. ``sync``, ``one_step_off`` and ``fully_async`` (1) only,
  4 steps, one seed.
- ``agent_latency``: ``agent=calculator`` (multi-turn episodes that call a
  multiply tool; 1 to 3 model turns), its tool given a latency uniform in
  [0, 2] s (``agent.tool_latency_s=[0,2]``), 16 prompts x 4 episodes a step on
  two replicas (``rollout.replicas=2``).

Measured per run, over steps 2..N (step 1 carries one-off costs; validation
and checkpoints are outside the steps, ``trainer.val_every=0``):

- samples/s: samples trained / the steps' seconds (``timing/step_s`` summed);
- generated tokens/s: response tokens trained / the same seconds;
- trainer idle: the share of those seconds the trainer waited for samples
  (sync: ``timing/generate_s``; one_step_off: ``timing/generate_wait_s``;
  fully_async: ``async/trainer_wait_s``);
- rollout idle: ``perf/rollout_idle_frac``, the replicas' share of time with nothing
  to generate (from each engine's busy seconds);
- staleness: ``async/staleness_mean`` (updates, per token) and its maximum;
  ``async/partial_frac`` and ``async/dropped_stale``;
- held-out greedy accuracy after the last step (``val/accuracy``);
- CPU busy: the machine's busy share of its CPU time over steps 2..N-1 (from
  ``/proc/stat``; the share the hypervisor took is kept as
  ``cpu_stolen_frac``), and the busy core-seconds per sample trained. Since
  samples/s = busy share x cores / core-seconds per sample, a mode's ratio to
  ``sync`` splits into its work per sample and its busy share, and a mode can
  reach at most ``sync``'s samples/s x (``sync``'s core-seconds per sample / its
  own) / ``sync``'s busy share, with every core busy
  (``fully_async_max_vs_sync_samples_s``).

Writes bench/results/async.md (one table per workload) and
bench/results/async.json (per workload: ``fully_async_vs_sync_samples_s`` and
``fully_async_vs_one_step_off_samples_s`` at max_staleness 2 with partial
rollout, seed 0; ``fully_async_vs_sync_samples_s_both_seeds``, the same over
the seed-0 and seed-1 runs together; ``accuracy`` per mode; the command and run
directory that measured it; and every run's raw figures). Runs stay in
bench/.runs/async-<time>/.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parent.parent
RESULTS_MD = REPO / "bench" / "results" / "async.md"
RESULTS_JSON = REPO / "bench" / "results" / "async.json"

MODES: dict[str, list[str]] = {
    "sync": ["trainer.async_mode=sync"],
    "one_step_off": ["trainer.async_mode=one_step_off"],
    "fully_async_s1": ["trainer.async_mode=fully_async", "async.max_staleness=1"],
    "fully_async_s2": ["trainer.async_mode=fully_async", "async.max_staleness=2"],
    "fully_async_s4": ["trainer.async_mode=fully_async", "async.max_staleness=4"],
    "fully_async_s2_no_partial": [
        "trainer.async_mode=fully_async", "async.max_staleness=2", "async.partial_rollout=false",
    ],
}  # fmt: skip
HEADLINE = "fully_async_s2"
WORKLOADS = ("long_tail", "long_tail_tiny", "agent_latency", "trl_shape")
# Workloads that run fewer modes, fewer steps and no second seed (their steps are long).
SHORT = {"trl_shape": (("sync", "one_step_off", "fully_async_s1"), 4)}
NOISE_MODES = ("sync", HEADLINE)  # run again with seed 1
QUICK_MODES = ("sync", "one_step_off", HEADLINE)


def long_tail_rows(count: int, seed: int, path: Path) -> list[int]:
    """Arithmetic prompts with a forced completion length each (lognormal, median
    16, p99 10x the median, clipped to [4, 192]); returns the lengths."""
    from rlpost.data.tasks.arith import make_row

    rng = random.Random(seed)
    sigma = math.log(10) / 2.326  # p99 / median = exp(2.326 sigma) = 10
    lengths = []
    with path.open("w") as f:
        for _ in range(count):
            length = int(min(192, max(4, round(rng.lognormvariate(math.log(16), sigma)))))
            row = {**make_row(rng.randint(0, 99), rng.randint(0, 99)), "max_tokens": length,
                   "min_tokens": length}  # fmt: skip
            f.write(json.dumps(row) + "\n")
            lengths.append(length)
    return lengths


def workload_args(name: str, run_root: Path, steps: int) -> list[str]:
    common = [f"trainer.total_steps={steps}", "trainer.val_every=0", "trainer.save_every=0",
              "trainer.save_final=false"]  # fmt: skip
    if name.startswith("long_tail"):
        train, val = run_root / "long_tail_train.jsonl", run_root / "long_tail_val.jsonl"
        if not train.exists():
            long_tail_rows(2000, 0, train)
            from rlpost.data.tasks.arith import make_row

            rng = random.Random(1)
            val.write_text(
                "".join(
                    json.dumps(make_row(rng.randint(0, 99), rng.randint(0, 99))) + "\n"
                    for _ in range(64)
                )
            )
        return [
            *common, "model=tiny" if name == "long_tail_tiny" else "model=small", "data=files", f"data.train_files=[{train}]",
            f"data.val_files=[{val}]", "data.val_size=64", "data.prompts_per_step=16", "data.max_prompt_tokens=32",
            "rollout.n=2", "trainer.packing=true", "rollout.max_tokens=192", "rollout.max_model_len=256",
            "rollout.max_logprob_gap=null", "rollout.max_mean_logprob_gap=null",
            "reward=arith",
        ]  # fmt: skip
    if name == "trl_shape":  # bench/compare_trl.py's realistic shape
        return [
            *common, "model=small", "data.prompts_per_step=32", "rollout.n=8",
            "rollout.max_tokens=100", "rollout.min_tokens=100", "rollout.temperature=1.0",
            "trainer.lr=1e-4", "trainer.lr_warmup_steps=0", "trainer.micro_batch_size=64",
            "rollout.max_logprob_gap=null", "data.val_size=16",
        ]  # fmt: skip
    return [
        *common, "agent=calculator", "agent.tool_latency_s=[0,2]", "rollout.replicas=2",
        "data.prompts_per_step=16", "rollout.n=4", "data.val_size=100",
    ]  # fmt: skip


def run_mode(workload: str, mode: str, seed: int, run_root: Path, steps: int) -> dict:
    run_dir = run_root / workload / f"{mode}-seed{seed}"
    cache = run_root / "model-cache"
    args = [*workload_args(workload, run_root, steps), *MODES[mode], f"trainer.seed={seed}",
            f"trainer.run_dir={run_dir}", f"model.cache_dir={cache}"]  # fmt: skip
    env = {**os.environ, "TQDM_DISABLE": "1"}
    start = time.perf_counter()
    log = run_dir.with_suffix(".log")
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rlpost.main", *args], stdout=out,
                                stderr=subprocess.STDOUT, env=env, cwd=REPO)  # fmt: skip
        try:
            marks = cpu_at_each_step(proc, run_dir / "metrics.jsonl")
        except BaseException:  # the bench is stopped: so is its run
            proc.kill()
            proc.wait()
            raise
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{workload} {mode} seed {seed} failed; see {log}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    figures = summarise(rows)
    figures.update(cpu_use(marks, rows, steps))
    figures["wall_s"] = wall
    (run_dir / "bench.json").write_text(json.dumps(figures, indent=1))
    print(f"  {workload:13s} {mode:26s} seed {seed}: {figures['samples_per_s']:.2f} samples/s, "
          f"accuracy {figures['accuracy']}, {wall:.0f} s", flush=True)  # fmt: skip
    return figures


def cpu_seconds() -> tuple[float, float, float]:
    """The machine's CPU seconds so far, all cores: (busy, idle, stolen by the
    hypervisor), from the first line of /proc/stat."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = ticks
    hz = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / hz, (idle + iowait) / hz, steal / hz


ROLES = {"ray::TrainerWorker": "trainer", "ray::RolloutWorker": "rollout"}


def process_seconds() -> dict[int, tuple[str, float]]:
    """Every process's role (``ROLES`` by its title, else "other") and CPU seconds so far."""
    hz = os.sysconf("SC_CLK_TCK")
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            title = (entry / "cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
        except OSError:  # it ended meanwhile
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # utime and stime are fields 14, 15
        role = next((r for prefix, r in ROLES.items() if title.startswith(prefix)), "other")
        out[int(entry.name)] = (role, (int(fields[11]) + int(fields[12])) / hz)
    return out


class Mark(NamedTuple):
    busy: float
    idle: float
    stolen: float
    processes: dict[int, tuple[str, float]]


def cpu_at_each_step(proc: subprocess.Popen, metrics: Path) -> dict[int, Mark]:
    """Until ``proc`` ends: the machine's and each process's CPU seconds when each
    step's line reaches ``metrics`` (a step's line is written as the step ends)."""
    marks: dict[int, Mark] = {}
    seen = 0
    while proc.poll() is None:
        time.sleep(0.05)
        if not metrics.exists():
            continue
        text = metrics.read_text()
        complete = text[: text.rfind("\n") + 1].splitlines()
        if len(complete) > seen:
            now = Mark(*cpu_seconds(), process_seconds())
            for line in complete[seen:]:
                marks[json.loads(line)["step"]] = now
            seen = len(complete)
    return marks


def cpu_use(marks: dict[int, Mark], rows: list[dict], steps: int) -> dict:
    """The machine's CPU use over steps 2..N-1 (from step 1's line to step N-1's;
    step N's line waits for the last validation): the busy share of the CPU time
    the machine had, the share the hypervisor took, and busy core-seconds per
    trained sample, in all and by role (the trainer's ranks, the replicas, and
    the rest: the driver, Ray's daemons, the kernel). ``cpu_bound`` reads them."""
    if 1 not in marks or steps - 1 not in marks or steps < 3:
        return {}
    a, b = marks[1], marks[steps - 1]
    busy, idle, stolen = b.busy - a.busy, b.idle - a.idle, b.stolen - a.stolen
    by_role = {"trainer": 0.0, "rollout": 0.0}
    for pid, (role, seconds) in b.processes.items():
        if role in by_role:  # a process started since step 1 counts from its start
            by_role[role] += seconds - a.processes.get(pid, (role, 0.0))[1]
    samples = max(sum(r["data/samples"] for r in rows if 2 <= r["step"] <= steps - 1), 1)
    return {
        "cpu_busy_frac": busy / max(busy + idle, 1e-9),
        "cpu_stolen_frac": stolen / max(busy + idle + stolen, 1e-9),
        "core_s_per_sample": busy / samples,
        "trainer_core_s_per_sample": by_role["trainer"] / samples,
        "rollout_core_s_per_sample": by_role["rollout"] / samples,
        "other_core_s_per_sample": (busy - sum(by_role.values())) / samples,
    }


def summarise(rows: list[dict]) -> dict:
    """A run's figures from its metrics.jsonl rows."""
    steps = [r for r in rows if r["step"] >= 2]
    seconds = sum(r["timing/step_s"] for r in steps)
    samples = sum(r["data/samples"] for r in steps)
    tokens = sum(r["response/length_mean"] * r["data/samples"] for r in steps)
    wait_key = next(
        k for k in ("async/trainer_wait_s", "timing/generate_wait_s", "timing/generate_s")
        if k in steps[0]
    )  # fmt: skip
    val = [r["val/accuracy"] for r in rows if "val/accuracy" in r]
    mean = statistics.fmean
    return {
        "steps": len(steps),
        "seconds": seconds,
        "samples": samples,
        "samples_per_s": samples / seconds,
        "tokens_per_s": tokens / seconds,
        "step_s": seconds / len(steps),
        "trainer_idle_frac": sum(r[wait_key] for r in steps) / seconds,
        "rollout_idle_frac": mean(r.get("perf/rollout_idle_frac", float("nan")) for r in steps),
        "staleness_mean": mean(r.get("async/staleness_mean", 0.0) for r in steps),
        "staleness_max": max(r.get("async/staleness_max", 0.0) for r in steps),
        "partial_frac": mean(r.get("async/partial_frac", 0.0) for r in steps),
        "dropped_stale": steps[-1].get("async/dropped_stale", 0.0),
        "interrupted_requests": steps[-1].get("rollout/interrupted_requests", 0.0),
        "weight_sync_s": mean(r.get("timing/weight_sync_s", 0.0) for r in steps),
        "accuracy_start": val[0] if val else None,
        "accuracy": val[-1] if val else None,
    }


def cpu_bound(sync: dict | None, other: dict | None) -> float | None:
    """The most ``other`` could reach over ``sync`` in samples/s with its own CPU
    work per sample and every core busy (samples/s = busy share x cores /
    core-seconds per sample); None where a run lacks the CPU figures."""
    keys = ("cpu_busy_frac", "core_s_per_sample")
    if not sync or not other or any(f.get(k) is None for f in (sync, other) for k in keys):
        return None
    return sync["core_s_per_sample"] / (other["core_s_per_sample"] * sync["cpu_busy_frac"])


def cpu_sentence(sync: dict, other: dict, name: str) -> str:
    """Where ``other``'s ratio to ``sync`` comes from, in CPU terms."""
    work = other["core_s_per_sample"] / sync["core_s_per_sample"]
    busy = other["cpu_busy_frac"] / sync["cpu_busy_frac"]

    def split(f: dict) -> str:
        if f.get("trainer_core_s_per_sample") is None:
            return ""  # measured before the roles were
        return (
            f" (trainer {f['trainer_core_s_per_sample']:.3f}, replicas "
            f"{f['rollout_core_s_per_sample']:.3f}, the rest {f['other_core_s_per_sample']:.3f})"
        )

    return (
        f" In CPU terms (samples/s = busy share x cores / core-seconds per sample): sync kept "
        f"the cores {sync['cpu_busy_frac']:.0%} busy at {sync['core_s_per_sample']:.3f} "
        f"core-seconds a sample{split(sync)}, {name} {other['cpu_busy_frac']:.0%} at "
        f"{other['core_s_per_sample']:.3f}{split(other)}: {work:.2f}x sync's work a sample at "
        f"{busy:.2f}x its busy share, so {busy / work:.2f}x its samples/s. With every core busy, "
        f"{name}'s work a sample allows at most {cpu_bound(sync, other):.2f}x sync."
    )


def _num(figures: dict, key: str, digits: int = 2) -> str:
    """A figure to ``digits`` places, or "-" for a run measured before it was kept."""
    value = figures.get(key)
    return "-" if value is None else f"{value:.{digits}f}"


def both_seeds(runs: dict, mode: str) -> float | None:
    """Samples/s of the mode's seed-0 and seed-1 runs together (None without both)."""
    keys = [f"{mode}-seed{s}" for s in (0, 1)]
    if any(k not in runs for k in keys):
        return None
    pair = [runs[k] for k in keys]
    return sum(f["samples"] for f in pair) / sum(f["seconds"] for f in pair)


def shown(path: Path) -> Path:
    """``path`` relative to the repository where it lies inside it."""
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def report(results: dict, roots: dict[str, Path], command: str) -> None:
    """Write the tables and the JSON; ``roots``: each workload's run directory."""
    commands = {w: (command, f"{shown(roots[w])}/{w}") for w in results}
    # A run of some workloads keeps the others' results (their raw figures and
    # the command that measured them) as they were.
    if RESULTS_JSON.exists():
        before = json.loads(RESULTS_JSON.read_text())
        for w in WORKLOADS:
            if w in before and w not in results:
                results = {**results, w: before[w]["raw"]}
                commands[w] = (before[w].get("command", "?"), before[w].get("runs", "?"))
        results = {w: results[w] for w in WORKLOADS if w in results}
    lines = [
        "# sync, one_step_off and fully_async",
        "",
        f"On this machine ({os.cpu_count()} CPU cores, no GPU); each workload names the command "
        "that measured it. Steps 2..N of each run; seed 0 unless marked. See "
        "`bench/async_bench.py` for the method.",
        "",
    ]
    out: dict = {}
    for workload, runs in results.items():
        base = {k.removesuffix("-seed0"): v for k, v in runs.items() if k.endswith("-seed0")}
        lines += [f"## {workload}", "", "`{}` (runs in `{}`)".format(*commands[workload]), "", "| mode | seed | samples/s | vs sync | tokens/s | step s | "
                  "trainer idle | rollout idle | CPU busy | core-s / sample | staleness mean / max | "
                  "partial | dropped | accuracy |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        sync = base.get("sync", {}).get("samples_per_s")
        order = list(MODES)
        for key, f in sorted(runs.items(), key=lambda kv: (
            order.index(kv[0].rpartition("-seed")[0]) if kv[0].rpartition("-seed")[0] in order
            else len(order), kv[0].rpartition("-seed")[2])):  # fmt: skip
            mode, _, seed = key.rpartition("-seed")
            ratio = f"{f['samples_per_s'] / sync:.2f}x" if sync else "-"
            acc = (
                "-"
                if f["accuracy"] is None
                else f"{f['accuracy_start']:.3f} -> {f['accuracy']:.3f}"
            )
            lines.append(
                f"| {mode} | {seed} | {f['samples_per_s']:.2f} | {ratio} | {f['tokens_per_s']:.0f} "
                f"| {f['step_s']:.2f} | {f['trainer_idle_frac']:.2f} | {f['rollout_idle_frac']:.2f} "
                f"| {_num(f, 'cpu_busy_frac')} | {_num(f, 'core_s_per_sample', 3)} "
                f"| {f['staleness_mean']:.2f} / {f['staleness_max']:.0f} | {f['partial_frac']:.2f} "
                f"| {f['dropped_stale']:.0f} | {acc} |"
            )
        noise = {
            m: abs(runs[f"{m}-seed0"]["accuracy"] - runs[f"{m}-seed1"]["accuracy"])
            for m in NOISE_MODES
            if f"{m}-seed1" in runs and runs[f"{m}-seed0"]["accuracy"] is not None
        }
        # a short workload runs fully_async at max_staleness 1 only
        headline = HEADLINE if HEADLINE in base else "fully_async_s1"
        head = base.get(headline)
        pooled = both_seeds(runs, headline), both_seeds(runs, "sync")
        entry = {
            "command": commands[workload][0],
            "runs": commands[workload][1],
            "fully_async_vs_sync_samples_s": head["samples_per_s"] / sync if head and sync else None,
            "fully_async_vs_one_step_off_samples_s": (
                head["samples_per_s"] / base["one_step_off"]["samples_per_s"]
                if head and "one_step_off" in base else None
            ),
            # The batches' longest samples differ between seeds, and sync waits for them.
            "fully_async_vs_sync_samples_s_both_seeds": (
                pooled[0] / pooled[1] if pooled[0] and pooled[1] else None
            ),
            "cpu_busy_frac": {m: f.get("cpu_busy_frac") for m, f in base.items()},
            "core_s_per_sample": {m: f.get("core_s_per_sample") for m, f in base.items()},
            "fully_async_max_vs_sync_samples_s": cpu_bound(base.get("sync"), head),
            "accuracy": {m: f["accuracy"] for m, f in base.items()},
            "accuracy_seed_noise": noise,
            "raw": runs,
        }  # fmt: skip
        out[workload] = entry
        lines += [
            "",
            f"fully_async (max_staleness {headline.removeprefix('fully_async_s')}, partial "
            "rollout) over sync: "
            f"**{entry['fully_async_vs_sync_samples_s'] or float('nan'):.2f}x** samples/s; over "
            f"one_step_off: **{entry['fully_async_vs_one_step_off_samples_s'] or float('nan'):.2f}x**."
            + (
                " Seeds 0 and 1 together (samples over seconds of both runs): "
                f"{entry['fully_async_vs_sync_samples_s_both_seeds']:.2f}x sync."
                if entry["fully_async_vs_sync_samples_s_both_seeds"]
                else ""
            )
            + (
                cpu_sentence(base["sync"], head, headline)
                if head and entry["fully_async_max_vs_sync_samples_s"]
                else ""
            )
            + (
                " Accuracy noise between seeds 0 and 1: "
                + ", ".join(f"{m} {v:.3f}" for m, v in noise.items())
                + "."
                if noise
                else ""
            ),
            "",
        ]
    RESULTS_MD.write_text("\n".join(lines))
    RESULTS_JSON.write_text(json.dumps(out, indent=1) + "\n")
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    assert __doc__ is not None
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=("all", *WORKLOADS), default="all")
    p.add_argument("--steps", type=int, default=12, help="RL steps per run")
    p.add_argument("--quick", action="store_true", help="3 steps, sync/one_step_off/fully_async")
    p.add_argument(
        "--report", type=Path, nargs="+",
        help="rewrite the results from these run directories (a workload from the last that has it)",
    )  # fmt: skip
    args = p.parse_args(argv)
    workloads = list(WORKLOADS) if args.workload == "all" else [args.workload]
    command = "python bench/async_bench.py" + " ".join(["", *(argv or sys.argv[1:])]).rstrip()
    results: dict[str, dict] = {}
    if args.report:
        roots = {}
        for root in args.report:
            for w in workloads:
                if (root / w).is_dir():
                    roots[w] = root.resolve()
                    results[w] = {
                        d.name: json.loads((d / "bench.json").read_text())
                        for d in sorted((root / w).iterdir()) if (d / "bench.json").exists()
                    }  # fmt: skip
        report(results, roots, command)
        return 0
    run_root = REPO / "bench" / ".runs" / time.strftime("async-%Y%m%d-%H%M%S")
    run_root.mkdir(parents=True)
    steps = 3 if args.quick else args.steps
    modes = QUICK_MODES if args.quick else tuple(MODES)
    for workload in workloads:
        runs: dict[str, dict] = {}
        w_modes, w_steps = SHORT.get(workload, (modes, steps))
        for mode in w_modes if not args.quick else modes:
            runs[f"{mode}-seed0"] = run_mode(workload, mode, 0, run_root, w_steps)
        if not args.quick and workload not in SHORT:
            for mode in NOISE_MODES:
                runs[f"{mode}-seed1"] = run_mode(workload, mode, 1, run_root, steps)
        results[workload] = runs
        report(results, {w: run_root for w in results}, command)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
