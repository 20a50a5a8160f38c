"""The figures the README and the docs quote, measured by the commands they print.

    python bench/doc_figures.py            # all of them, about 10 minutes on two cores
    python bench/doc_figures.py --only eval

Runs, one at a time from the repository root, on the built-in task and model:

- ``quickstart``: the quick start, ``python -m rlpost.main algo=grpo`` (the
  default run), timed from the command to its exit;
- ``eval``: evaluation.md's two commands, 40 GRPO steps then ``python -m
  rlpost.eval ... eval.n=16 eval.k=[1,4,16]``: the run's time and last held-out
  accuracy, the evaluation's time and its ``eval.json`` summary;
- ``async``: async.md's fully asynchronous run of 60 steps validated every 10;
- ``small``: getting-started.md's larger model, two steps of ``model=small`` on
  one thread: its batch, and the step's and the update's seconds.

Writes ``bench/results/doc_figures.json``, which the pages' figure markers read
(``<!-- fig bench/results/doc_figures.json eval.overall.greedy .3f -->``;
docs/hooks.py renders them and tests/unit/test_docs_figures.py keeps the
committed text equal), and prints a table. The model cache is rlpost's default,
so the built-in model's warm-up happens once, before the first timed run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timed_cli import ROOT, timed_cli  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "doc_figures.json"
EVAL_STEPS = 40
ASYNC_STEPS = 60


def history(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def val_curve(run_dir: Path) -> list[float]:
    return [round(h["val/accuracy"], 4) for h in history(run_dir) if "val/accuracy" in h]


def run_summary(run_dir: Path, wall: float) -> dict:
    from rlpost.config.compose import compose

    steps = [h for h in history(run_dir) if h.get("step", 0) > 0]
    val = val_curve(run_dir)
    cfg = compose([])
    return {
        "wall_s": round(wall, 1),
        "wall_min": round(wall / 60, 1),
        "steps": len(steps),
        "val_accuracy": val,
        "val_first": val[0],
        "val_last": val[-1],
        "val_gain_points": round(100 * (val[-1] - val[0]), 1),
        "val_best": max(val),
        "val_best_gain_points": round(100 * (max(val) - val[0]), 1),
        "prompts_per_step": cfg.data.prompts_per_step,
        "samples_per_prompt": cfg.rollout.n,
    }


def quickstart(out: Path) -> dict:
    run_dir = out / "quickstart"
    wall = timed_cli(["algo=grpo", f"trainer.run_dir={run_dir}"], out, "quickstart")
    return run_summary(run_dir, wall)


def evaluation(out: Path) -> dict:
    run_dir = out / "grpo"
    args = ["algo=grpo", f"trainer.total_steps={EVAL_STEPS}", f"trainer.run_dir={run_dir}"]
    result = {"train": run_summary(run_dir, timed_cli(args, out, "eval_train"))}
    cmd = [sys.executable, "-m", "rlpost.eval", f"model.path={run_dir / 'final'}",
           "eval.n=16", "eval.k=[1,4,16]"]  # fmt: skip
    start = time.perf_counter()
    with open(out / "eval.log", "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"rlpost.eval failed ({proc.returncode}); see {out / 'eval.log'}")
    report = json.loads((run_dir / "final" / "eval" / "eval.json").read_text())
    result["eval_s"] = round(time.perf_counter() - start, 1)
    result["overall"] = {k: round(v, 4) for k, v in report["overall"].items()}
    result["pass16_percent"] = round(100 * report["overall"]["pass@16"], 1)
    return result


def fully_async(out: Path) -> dict:
    run_dir = out / "async"
    args = ["algo=grpo", "trainer.async_mode=fully_async", f"trainer.total_steps={ASYNC_STEPS}",
            "trainer.val_every=10", "trainer.seed=0", f"trainer.run_dir={run_dir}"]  # fmt: skip
    return run_summary(run_dir, timed_cli(args, out, "async"))


def small(out: Path) -> dict:
    run_dir = out / "small"
    args = ["algo=grpo", "model=small", "trainer.total_steps=2", "trainer.threads=1",
            f"trainer.run_dir={run_dir}"]  # fmt: skip
    wall = timed_cli(args, out, "small")
    steps = [h for h in history(run_dir) if h.get("step", 0) > 0]
    return {
        "wall_s": round(wall, 1),
        "samples_per_step": steps[-1]["data/samples"],
        "step_s": [round(h["timing/step_s"], 1) for h in steps],
        "update_s": [round(h["timing/update_s"], 1) for h in steps],
        "step_s_max": round(max(h["timing/step_s"] for h in steps), 1),
        "update_s_max": round(max(h["timing/update_s"] for h in steps), 1),
    }


RUNS = {"quickstart": quickstart, "eval": evaluation, "async": fully_async, "small": small}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=sorted(RUNS), action="append")
    args = parser.parse_args()
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    with tempfile.TemporaryDirectory(prefix="rlpost-doc-figures-") as tmp:
        out = Path(tmp)
        # the warm-up of the built-in model, outside the timed runs
        timed_cli(["trainer.total_steps=0", f"trainer.run_dir={out / 'warm'}"], out, "warm")
        for name in args.only or list(RUNS):
            results[name] = RUNS[name](out)
            RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    q, e, a = (results.get(k, {}) for k in ("quickstart", "eval", "async"))
    print("| run | wall | held-out accuracy |\n|---|---|---|")
    if q:
        print(f"| quick start | {q['wall_s']} s | {q['val_first']} -> {q['val_last']} |")
    if e:
        print(f"| {EVAL_STEPS} GRPO steps | {e['train']['wall_s']} s | {e['train']['val_last']} |")
        print(f"| rlpost.eval n=16 | {e['eval_s']} s | {e['overall']} |")
    if a:
        print(f"| fully_async, {ASYNC_STEPS} steps | {a['wall_s']} s | {a['val_accuracy']} |")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
