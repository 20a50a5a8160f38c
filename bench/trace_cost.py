"""What the run timeline costs: ``trainer.trace`` off, steps and full, side by side.

    python bench/trace_cost.py              # default task, 16 steps, each level twice
    python bench/trace_cost.py --steps 6 --reps 1   # a smoke run

Every run is the real CLI (``python -m rlpost.main algo=grpo``, the built-in
task and model, seed 0, no validation or checkpoints inside the steps), the
levels interleaved (off, steps, full, off, steps, full, ...) so that a drift of
the machine's speed falls on all of them. Measured over steps 2..N (step 1
carries one-off costs):

- step seconds: the median ``timing/step_s`` (a step slowed by another process
  on the machine does not count);
- drain share: the median of ``perf/trace_s`` (gathering every process's spans
  and writing them, once a step) over the step's seconds: the part of the cost
  that is measured directly;
- cost vs off: the level's median step seconds (mean of its runs) over ``off``'s, minus 1 (the drain
  and the recording inside the steps; as noisy as the step time itself, so
  the spread of ``off``'s own runs is printed beside it);
- coverage: the share of each step's span that the controller's named steps
  cover (``rlpost.loop.trace_file.critical_path``), and the events a step writes.

Writes bench/results/trace_cost.json and trace_cost.md; keeps the runs in
bench/.runs/trace_cost (the board's timeline page reads them).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.timed_cli import ROOT, timed_cli  # noqa: E402
from rlpost.loop.trace_file import critical_path, read_trace, step_spans  # noqa: E402

LEVELS = ("off", "steps", "full")


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def coverage(run_dir: Path, steps: range) -> tuple[float, float]:
    """Mean share of a step covered by the controller's named steps; events a step."""
    events = read_trace(run_dir / "trace.json")
    shares, counts = [], []
    for step in steps:
        outer, spans = step_spans(events, step)
        assert outer is not None, f"step {step} has no span in {run_dir}/trace.json"
        top = [e for e in critical_path(outer, spans) if e["pid"] == outer["pid"]]
        shares.append(sum(float(e["dur"]) for e in top) / float(outer["dur"]))  # type: ignore[arg-type]
        counts.append(len(spans) + 1)
    return statistics.mean(shares), statistics.mean(counts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--extra", nargs="*", default=[], help="more overrides for every run")
    args = p.parse_args()
    out = ROOT / "bench" / ".runs" / "trace_cost"
    out.mkdir(parents=True, exist_ok=True)
    steps = range(2, args.steps + 1)
    per: dict[str, list[dict]] = {level: [] for level in LEVELS}
    for rep in range(args.reps):
        for level in LEVELS:
            name = f"{level}-{rep}"
            run_dir = out / name
            if run_dir.exists():
                import shutil

                shutil.rmtree(run_dir)
            cli = ["algo=grpo", f"trainer.total_steps={args.steps}", "trainer.val_every=0",
                   "trainer.save_every=0", "trainer.save_final=false", f"trainer.trace={level}",
                   f"trainer.run_dir={run_dir}", *args.extra]  # fmt: skip
            wall = timed_cli(cli, out, name)
            got = [r for r in rows(run_dir) if r["step"] in steps]
            # the median: a step another process slowed is not the trace's cost
            step_s = statistics.median(r["timing/step_s"] for r in got)
            result = {"run": name, "wall_s": wall, "step_s": step_s}
            if level != "off":
                result["drain_share"] = statistics.median(
                    r["perf/trace_s"] / r["timing/step_s"] for r in got
                )
                result["coverage"], result["events_per_step"] = coverage(run_dir, steps)
            per[level].append(result)
            print(f"{name}: {step_s:.3f} s a step", flush=True)
    off = statistics.mean(r["step_s"] for r in per["off"])
    off_spread = (max(r["step_s"] for r in per["off"]) - min(r["step_s"] for r in per["off"])) / off
    table = {}
    for level in LEVELS:
        runs = per[level]
        mean = statistics.mean(r["step_s"] for r in runs)
        table[level] = {
            "step_s": mean,
            "cost_vs_off": mean / off - 1,
            "drain_share": statistics.mean(r.get("drain_share", 0.0) for r in runs),
            "coverage": statistics.mean(r.get("coverage", 0.0) for r in runs),
            "events_per_step": statistics.mean(r.get("events_per_step", 0.0) for r in runs),
            "runs": runs,
        }
    result = {
        "steps": args.steps,
        "reps": args.reps,
        "extra": args.extra,
        "off_spread": off_spread,
        "levels": table,
        "steps_cost_vs_off": table["steps"]["cost_vs_off"],
        "steps_drain_share": table["steps"]["drain_share"],
    }
    lines = [
        f"# trainer.trace: what the timeline costs ({args.steps} steps, steps 2..{args.steps}, "
        f"{args.reps} run(s) a level, interleaved)",
        "",
        f"`python bench/trace_cost.py --steps {args.steps} --reps {args.reps}"
        + (f" --extra {' '.join(args.extra)}" if args.extra else "")
        + "`",
        "",
        "| trainer.trace | step (s) | cost vs off | drain share | named steps cover | events a step |",
        "|---|---|---|---|---|---|",
    ]
    for level in LEVELS:
        t = table[level]
        lines.append(
            f"| {level} | {t['step_s']:.3f} | {100 * t['cost_vs_off']:+.1f} % | "
            f"{100 * t['drain_share']:.2f} % | {100 * t['coverage']:.1f} % | {t['events_per_step']:.0f} |"
        )
    lines += ["", f"The spread of `off`'s own runs: {100 * off_spread:.1f} % of its step time."]
    text = "\n".join(lines) + "\n"
    print(text)
    results = ROOT / "bench" / "results"
    (results / "trace_cost.json").write_text(json.dumps(result, indent=1) + "\n")
    (results / "trace_cost.md").write_text(text)


if __name__ == "__main__":
    main()
