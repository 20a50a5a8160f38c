"""On-policy distillation against GRPO from the same start, on the built-in task.

    python bench/opd_bench.py                                   # 150 steps each, seed 0
    python bench/opd_bench.py --teacher-steps 80 --steps 80     # shorter
    python bench/opd_bench.py --teacher bench/.runs/opd-<time>/grpo  # reuse a teacher
    python bench/opd_bench.py --teacher <grpo run> --opd <opd run>     # tabulate two runs

1. GRPO: ``python -m rlpost.main algo=grpo`` for ``--teacher-steps`` from the
   warmed-up base (seed 0), validating every 10 steps. Its ``run_dir/final`` is the
   teacher, and its curve is GRPO's from the same start (the same run: the first
   ``--steps`` steps of it).
2. OPD: ``python -m rlpost.main algo=opd teacher.path=<grpo>/final`` for
   ``--steps`` from the same base, the same seed, data and batch.

Reported: the teacher's held-out greedy accuracy (its last validation), and for
each run the first validated step at or above the teacher's accuracy minus 5
points, with the training wall seconds to it (the sum of ``timing/step_s`` and
``timing/val_s`` up to that step: start-up excluded), and both curves.

Writes bench/results/opd.md and bench/results/opd.json; the runs stay in
bench/.runs/opd-<time>/.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT / "bench"))

from timed_cli import timed_cli  # noqa: E402

MARGIN = 0.05  # "within 5 points of the teacher"


def run(name: str, args: list[str], steps: int, out: Path) -> tuple[list[dict], float]:
    """One CLI run; returns its metrics history and its wall seconds."""
    run_dir = out / name
    wall = timed_cli([
        *args, f"trainer.total_steps={steps}", "trainer.val_every=10", "trainer.seed=0",
        f"trainer.run_dir={run_dir}",
    ], out, name)  # fmt: skip
    return read(run_dir), wall


def read(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def curve(history: list[dict], last: int) -> list[tuple[int, float, float]]:
    """(step, held-out accuracy, training seconds so far) at each validation <= last."""
    out, seconds = [], 0.0
    for h in history:
        if h["step"] > last:
            break
        seconds += h.get("timing/step_s", 0.0) + h.get("timing/val_s", 0.0)
        if "val/accuracy" in h:
            out.append((h["step"], h["val/accuracy"], seconds))
    return out


def reached(points: list[tuple[int, float, float]], target: float) -> tuple[int, float] | None:
    for step, acc, seconds in points:
        if acc >= target - 1e-9:
            return step, seconds
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=150, help="OPD steps (and GRPO's compared)")
    parser.add_argument("--teacher-steps", type=int, default=150, help="GRPO steps of the teacher")
    parser.add_argument("--teacher", type=Path, help="a GRPO run dir to reuse as the teacher")
    parser.add_argument("--opd", type=Path, help="an OPD run dir to tabulate instead of a new run")
    args = parser.parse_args()
    load_before = os.getloadavg()
    out = ROOT / "bench" / ".runs" / f"opd-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True)
    if args.teacher is not None:
        grpo_dir, grpo, grpo_wall = args.teacher.resolve(), read(args.teacher), float("nan")
    else:
        grpo_dir = out / "grpo"
        grpo, grpo_wall = run("grpo", ["algo=grpo"], args.teacher_steps, out)
    teacher_acc = [h["val/accuracy"] for h in grpo if "val/accuracy" in h][-1]
    if args.opd is not None:
        opd, opd_wall = read(args.opd), float("nan")
    else:
        opd_args = ["algo=opd", f"teacher.path={grpo_dir / 'final'}"]
        opd, opd_wall = run("opd", opd_args, args.steps, out)
    target = teacher_acc - MARGIN
    curves = {"grpo": curve(grpo, args.steps), "opd": curve(opd, args.steps)}
    kl = {h["step"]: h["opd/reverse_kl"] for h in opd if "opd/reverse_kl" in h}
    summary = {
        "teacher_steps": len([h for h in grpo if h["step"] > 0]),
        "teacher_accuracy": teacher_acc,
        "target": target,
        "steps": args.steps,
        "wall_s": {"grpo": grpo_wall, "opd": opd_wall},
        "reached": {k: reached(v, target) for k, v in curves.items()},
        "curves": curves,
        "opd_reverse_kl": kl,
    }
    (RESULTS / "opd.json").write_text(json.dumps(summary, indent=1) + "\n")

    def when(name: str) -> str:
        hit = summary["reached"][name]
        return "not within the steps run" if hit is None else f"step {hit[0]}, {hit[1]:.0f} s"

    lines = [
        f"Built-in task, seed 0, {args.steps} steps of 32 prompts x 8 samples each, validated "
        f"every 10 steps (200 held-out prompts, greedy). Teacher: the built-in model after "
        f"{summary['teacher_steps']} GRPO steps, held-out accuracy {teacher_acc:.3f}; target "
        f"(teacher - 5 points) {target:.3f}. GRPO's curve is the teacher run's own first "
        f"{args.steps} steps (the same start). Seconds: training wall time (steps and "
        "validations, start-up excluded). Measured on 2 CPU cores; the 1/5/15-minute load "
        f"average was {' '.join(f'{x:.1f}' for x in load_before)} when this script started and "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} when it ended (above 2: other "
        "processes shared the cores, and the seconds are longer than on an idle machine).",
        "",
        "| run | reaches the target | accuracy at the last step | run wall time |",
        "| --- | --- | --- | --- |",
    ]
    for name, label in (("grpo", "GRPO"), ("opd", "OPD (`algo=opd`)")):
        wall = summary["wall_s"][name]
        lines.append(
            f"| {label} | {when(name)} | {curves[name][-1][1]:.3f} | "
            f"{'-' if wall != wall else f'{wall:.0f} s'} |"
        )
    lines += [
        "",
        "| step | GRPO accuracy | GRPO s | OPD accuracy | OPD s | OPD reverse KL (nats/token) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    grpo_at = {s: (a, t) for s, a, t in curves["grpo"]}
    for step, acc, seconds in curves["opd"]:
        g = grpo_at.get(step)
        g_text = f"{g[0]:.3f} | {g[1]:.0f}" if g else "- | -"
        k = kl.get(step)
        lines.append(
            f"| {step} | {g_text} | {acc:.3f} | {seconds:.0f} | "
            f"{'-' if k is None else f'{k:.3f}'} |"
        )
    text = "\n".join(lines) + "\n"
    (RESULTS / "opd.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
