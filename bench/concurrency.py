"""``async.max_inflight=auto`` against a sweep of fixed limits, on the agent-latency
workload of bench/async_bench.py.

    python bench/concurrency.py                  # fixed 8, 16, 32, 48 and auto, 20 steps
    python bench/concurrency.py --steps 6 --limits 16 auto   # a smoke run

The workload: ``agent=calculator`` (multi-turn episodes calling a multiply tool
whose latency is uniform in [0, 2] s), 16 prompts x 4 episodes a step on two
replicas, ``trainer.async_mode=fully_async`` with ``async.max_staleness=2`` (so
up to 3 x 16 = 48 groups may be in flight). Every run is the real CLI, seed 0,
one after another, from the calculator base rlpost ships (``model.path``: no
warm-up); then the best fixed limit and ``auto`` run again (seed 1
for both) for the noise. Measured over steps 3..N (the first steps carry
one-off costs and ``auto``'s first adjustments are part of what is measured
from step 3 on): samples/s (samples trained over the steps' seconds), the
trainer's wait share, preemptions, groups trimmed and the limit ``auto``
ended at.

Writes bench/results/concurrency.json (``auto_vs_best_fixed``: auto's samples/s
over the best fixed limit's, both seeds pooled) and concurrency.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.timed_cli import ROOT, timed_cli  # noqa: E402
from rlpost.config.compose import compose  # noqa: E402
from rlpost.models.warmup import SHIPPED_DIR, warmup_key  # noqa: E402

# the calculator base rlpost ships (model.path: no warm-up)
BASE = SHIPPED_DIR / warmup_key(compose(["agent=calculator"]))
WORKLOAD = [
    "algo=grpo", "agent=calculator", f"model.path={BASE}", "agent.tool_latency_s=[0,2]",
    "rollout.replicas=2", "data.prompts_per_step=16", "rollout.n=4",
    "trainer.async_mode=fully_async", "async.max_staleness=2",
    "trainer.val_every=0", "trainer.save_every=0", "trainer.save_final=false",
    "trainer.trace=off",
]  # fmt: skip


def measure(run_dir: Path, first: int) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    got = [r for r in rows if r["step"] >= first]
    seconds = sum(r["timing/step_s"] for r in got)
    samples = sum(r["data/samples"] for r in got)
    last = got[-1]
    return {
        "samples": samples,
        "seconds": seconds,
        "samples_per_s": samples / seconds,
        "trainer_wait_share": sum(r["async/trainer_wait_s"] for r in got) / seconds,
        "preemptions": last.get("rollout/preemptions", 0.0),
        "trimmed_groups": last.get("async/trimmed_groups", 0.0),
        "dropped_stale": last.get("async/dropped_stale", 0.0),
        "limit_path": [r.get("async/max_inflight") for r in rows if r["step"] > 0],
    }


def run(limit: str, seed: int, steps: int, out: Path) -> dict:
    name = f"inflight-{limit}-seed{seed}"
    run_dir = out / name
    if run_dir.exists():
        shutil.rmtree(run_dir)
    args = [*WORKLOAD, f"async.max_inflight={limit}", f"trainer.total_steps={steps}",
            f"trainer.seed={seed}", f"trainer.run_dir={run_dir}"]  # fmt: skip
    wall = timed_cli(args, out, name)
    result = {"limit": limit, "seed": seed, "wall_s": wall, **measure(run_dir, 3)}
    print(f"{name}: {result['samples_per_s']:.2f} samples/s, trainer waits "
          f"{100 * result['trainer_wait_share']:.0f} %", flush=True)  # fmt: skip
    return result


def pooled(runs: list[dict]) -> float:
    return sum(r["samples"] for r in runs) / sum(r["seconds"] for r in runs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--limits", nargs="*", default=["8", "16", "32", "48", "auto"])
    args = p.parse_args()
    out = ROOT / "bench" / ".runs" / "concurrency"
    out.mkdir(parents=True, exist_ok=True)
    runs = [run(limit, 0, args.steps, out) for limit in args.limits]
    fixed = [r for r in runs if r["limit"] != "auto"]
    best = max(fixed, key=lambda r: r["samples_per_s"]) if fixed else None
    if best is not None and "auto" in args.limits:
        runs += [run(best["limit"], 1, args.steps, out), run("auto", 1, args.steps, out)]
    by = {(r["limit"], r["seed"]): r for r in runs}
    result: dict = {"steps": args.steps, "workload": WORKLOAD, "runs": runs}
    if best is not None and "auto" in args.limits:
        auto_runs = [by["auto", 0], by["auto", 1]]
        best_runs = [by[best["limit"], 0], by[best["limit"], 1]]
        result["best_fixed"] = best["limit"]
        result["auto_vs_best_fixed"] = pooled(auto_runs) / pooled(best_runs)
        result["seed_noise"] = {
            k: abs(r0["samples_per_s"] - r1["samples_per_s"]) / statistics.mean(
                [r0["samples_per_s"], r1["samples_per_s"]])
            for k, (r0, r1) in (("auto", auto_runs), ("best_fixed", best_runs))
        }  # fmt: skip
    lines = [
        f"# async.max_inflight: auto against fixed limits (agent_latency, staleness 2, "
        f"steps 3..{args.steps})",
        "",
        f"`python bench/concurrency.py --steps {args.steps} --limits {' '.join(args.limits)}`",
        "",
        "| max_inflight | seed | samples/s | trainer waits | preemptions | trimmed | stale drops | limit (first, last) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        path = [x for x in r["limit_path"] if x is not None]
        ends = f"{path[0]:.0f}, {path[-1]:.0f}" if path else ""
        lines.append(
            f"| {r['limit']} | {r['seed']} | {r['samples_per_s']:.2f} | "
            f"{100 * r['trainer_wait_share']:.0f} % | {r['preemptions']:.0f} | "
            f"{r['trimmed_groups']:.0f} | {r['dropped_stale']:.0f} | {ends} |"
        )
    if "auto_vs_best_fixed" in result:
        n = result["seed_noise"]
        lines += [
            "",
            f"auto over the best fixed limit ({result['best_fixed']}), seeds 0 and 1 pooled: "
            f"**{result['auto_vs_best_fixed']:.2f}x** samples/s. Seed-to-seed spread: "
            f"auto {100 * n['auto']:.0f} %, best fixed {100 * n['best_fixed']:.0f} %.",
        ]
    text = "\n".join(lines) + "\n"
    print(text)
    results = ROOT / "bench" / "results"
    (results / "concurrency.json").write_text(json.dumps(result, indent=1) + "\n")
    (results / "concurrency.md").write_text(text)


if __name__ == "__main__":
    main()
