"""Rollout serving benchmark, in one run on this machine:

1. steps/s of ``trainer.async_mode=sync`` vs ``one_step_off`` on the default task
   (target: one_step_off >= 1.3x sync);
2. weight-sync share of the step time (target: < 10%);
3. prefix-cache hit rate of consistent hashing vs round-robin over 2 replicas
   against one replica (``bench/rollout_bench.py``; target: consistent hashing
   within 10% of one replica, round-robin clearly below).

Prints a table and writes it to bench/results/serving.md.

    python bench/serving.py [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def train(mode: str, steps: int, out: Path) -> dict[str, float]:
    """One CLI run; returns medians of its per-step timings (step 1 excluded: warm caches)."""
    run_dir = out / mode
    cmd = [
        sys.executable, "-m", "rlpost.main", f"trainer.async_mode={mode}",
        f"trainer.total_steps={steps}", "trainer.val_every=0", "trainer.save_final=false",
        # vLLM on the last core, the trainer on the others, in both modes.
        f"rollout.cpu_threads_bind={(os.cpu_count() or 1) - 1}",
        f"trainer.run_dir={run_dir}",
    ]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "TQDM_DISABLE": "1"},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps_rows = [r for r in rows if r["step"] > 1 and "timing/step_s" in r]
    step_s = statistics.median(r["timing/step_s"] for r in steps_rows)
    sync_s = statistics.median(r.get("timing/weight_sync_s", 0.0) for r in steps_rows)
    return {
        "step_s": step_s,
        "steps_per_s": 1.0 / step_s,
        "generate_s": statistics.median(r["timing/generate_s"] for r in steps_rows),
        "update_s": statistics.median(r["timing/update_s"] for r in steps_rows),
        "weight_sync_s": sync_s,
        "sync_share": sync_s / step_s,
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="rlpost-serving-"))
    results = {mode: train(mode, args.steps, out) for mode in ("sync", "one_step_off")}
    speedup = results["one_step_off"]["steps_per_s"] / results["sync"]["steps_per_s"]
    lines = [
        f"# Rollout serving benchmark ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f})",
        "",
        f"Command: `python bench/serving.py --steps {args.steps}` (default task, built-in model,"
        f" vLLM bound to core {(os.cpu_count() or 1) - 1}; medians over steps 2..N).",
        "",
        "| mode | step s | steps/s | generate s | update s | weight sync s | sync share |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for mode, r in results.items():
        lines.append(
            f"| {mode} | {r['step_s']:.3f} | {r['steps_per_s']:.2f} | {r['generate_s']:.3f} | "
            f"{r['update_s']:.3f} | {r['weight_sync_s']:.3f} | {100 * r['sync_share']:.1f}% |"
        )
    lines += [
        "",
        f"one_step_off / sync steps/s: **{speedup:.2f}x** (target >= 1.3x: "
        f"{'met' if speedup >= 1.3 else 'missed'}); weight-sync share of a sync step: "
        f"**{100 * results['sync']['sync_share']:.1f}%** (target < 10%: "
        f"{'met' if results['sync']['sync_share'] < 0.10 else 'missed'}).",
        "",
    ]
    subprocess.run([sys.executable, str(ROOT / "bench" / "rollout_bench.py")], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    lines.append((ROOT / "bench" / "results" / "rollout.md").read_text())
    text = "\n".join(lines)
    print(text)
    path = ROOT / "bench" / "results" / "serving.md"
    path.write_text(text)
    print(f"written to {path}")


if __name__ == "__main__":
    main()
