"""``data.curriculum=pool`` against uniform sampling, on a task mixing easy,
learnable and impossible prompts.

    python bench/curriculum.py                    # pool vs none, seeds 0 and 1, 60 steps
    python bench/curriculum.py --steps 6 --seeds 0   # a smoke run

The task is the built-in addition, as data files: 96 easy prompts (both
operands under 10: the shipped base mostly solves them), 192 learnable ones
(pairs of the built-in task's training set with an operand of 10 or more) and
96 impossible ones (the same kind of pair, its answer "impossible": no
completion is ever right; an answer one off the sum would be, now and then, and
teach the model to be wrong), shuffled together; held out, the built-in task's
200 pairs, which the training set does not hold. Every run is the real CLI from
the arithmetic base rlpost ships (``model.path``: no warm-up), 16 prompts x 8
samples a step, validated every 5 steps, ``data.curriculum_window=1`` (a prompt
is set aside after one group that agreed: each comes round only every 24
steps). Half of uniform sampling's prompts are easy or impossible, their groups
mostly all right or all wrong, so their advantage is zero: they cost generation
and teach nothing, which the pool stops once it has seen such a group.

One validation of 200 questions moves by 0.05-0.1 from one to the next, so
each curve is read smoothed: the mean of three validations in a row, and the
curves of all seeds averaged. Uniform sampling's smoothed accuracy at the last
step is the target; the samples each mode generated until its smoothed curve
first reached it (``samples_ratio_uniform_over_pool``: uniform's over the
pool's; more than 1 is the pool reaching the same accuracy with fewer samples;
0 when the pool never reaches it). The same figure per seed, and the second
half's mean accuracy, are in the table beside it.

``--add`` runs more seeds into the saved results instead of replacing them.

Writes bench/results/curriculum.json and curriculum.md, and the docs' figure
docs/images/curriculum.png.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.timed_cli import ROOT, timed_cli  # noqa: E402

VAL_EVERY = 5


def write_data(out: Path) -> tuple[Path, Path]:
    from rlpost.data.tasks.arith import ArithTask, make_row, split_pairs

    rng = random.Random(0)
    task = ArithTask()  # the built-in task: its held-out pairs are the bench's
    train, held = split_pairs(0, task.max_operand, task.num_val, task.seed)
    hard = [(a, b) for a, b in train if max(a, b) >= 10]
    learnable, impossible = hard[:192], hard[192:288]
    easy = rng.sample([(a, b) for a, b in train if max(a, b) < 10], 96)
    rows = [make_row(a, b) for a, b in easy + learnable]
    rows += [{**make_row(a, b), "answer": "impossible"} for a, b in impossible]
    rng.shuffle(rows)
    train_file, held_file = out / "mixed_train.jsonl", out / "mixed_val.jsonl"
    train_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    held_file.write_text("".join(json.dumps(make_row(a, b)) + "\n" for a, b in held))
    return train_file, held_file


def run(mode: str, seed: int, steps: int, out: Path, data: tuple[Path, Path]) -> dict:
    from rlpost.config.compose import compose
    from rlpost.models.warmup import SHIPPED_DIR, warmup_key

    name = f"{mode}-seed{seed}"
    run_dir = out / name
    if run_dir.exists():
        shutil.rmtree(run_dir)
    base = SHIPPED_DIR / warmup_key(compose([]))
    args = ["algo=grpo", f"model.path={base}", "data=files", f"data.train_files=[{data[0]}]",
            f"data.val_files=[{data[1]}]", "data.val_size=200", "data.prompts_per_step=16",
            "rollout.n=8", f"data.curriculum={mode}",
            *(["data.curriculum_window=1"] if mode != "none" else []), f"trainer.total_steps={steps}",
            f"trainer.val_every={VAL_EVERY}", "trainer.save_every=0", "trainer.save_final=false",
            "trainer.trace=off", f"trainer.seed={seed}", f"trainer.run_dir={run_dir}"]  # fmt: skip
    wall = timed_cli(args, out, name)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    generated, curve = 0.0, []
    for r in rows:
        generated += r.get("data/samples", 0.0)
        if "val/accuracy" in r:
            curve.append((r["step"], generated, r["val/accuracy"]))
    last = rows[-1]
    result = {"mode": mode, "seed": seed, "wall_s": wall, "curve": curve,
              "skipped": last.get("data/curriculum_skipped", 0.0),
              "settled_rows": last.get("data/curriculum_settled_rows", 0.0)}  # fmt: skip
    print(f"{name}: " + ", ".join(f"{s}:{a:.3f}" for s, _, a in curve), flush=True)
    return result


Curve = list[tuple[int, float, float]]  # (step, samples generated so far, held-out accuracy)
SMOOTH = 3  # validations averaged into one point


def smoothed(curve: Curve) -> Curve:
    """Each point from the mean of it and the validations before it, up to ``SMOOTH``."""
    return [
        (step, samples, sum(a for _, _, a in curve[max(0, i - SMOOTH + 1) : i + 1])
         / len(curve[max(0, i - SMOOTH + 1) : i + 1]))
        for i, (step, samples, _) in enumerate(curve)
    ]  # fmt: skip


def averaged(curves: list[Curve]) -> Curve:
    """The seeds' curves averaged point by point (the same validation steps)."""
    return [
        (points[0][0], sum(p[1] for p in points) / len(points),
         sum(p[2] for p in points) / len(points))
        for points in zip(*curves, strict=True)
    ]  # fmt: skip


def samples_to(curve: Curve, target: float) -> float | None:
    return next((samples for _, samples, acc in curve if acc >= target - 1e-9), None)


def reading(uniform: Curve, pool: Curve) -> dict:
    """Uniform's smoothed last accuracy as the target, and each mode's samples to it."""
    uni, poo = smoothed(uniform), smoothed(pool)
    target = uni[-1][2]
    u, q = samples_to(uni, target), samples_to(poo, target)
    return {"target_accuracy": target, "uniform_samples": u, "pool_samples": q,
            "samples_ratio_uniform_over_pool": (u / q) if (u and q) else 0.0}  # fmt: skip


def late_mean(curve: list[tuple[int, float, float]]) -> float:
    """The mean held-out accuracy of the validations in the run's second half: one
    validation of 200 questions moves by 0.05-0.1 from one to the next."""
    last = curve[-1][0]
    late = [acc for step, _, acc in curve if step >= last / 2]
    return sum(late) / len(late)


def ratio(r: dict) -> str:
    return f"{r['samples_ratio_uniform_over_pool']:.2f}x" if r["pool_samples"] else "-"


def reached(r: dict) -> str:
    pool = f"{r['pool_samples']:.0f}" if r["pool_samples"] is not None else "not reached"
    return f"{r['uniform_samples']:.0f} / {pool}"


def summary(per_seed: list[dict], steps: int) -> str:
    seeds = [s["seed"] for s in per_seed]
    pooled = reading(*(averaged([s["runs"][i]["curve"] for s in per_seed]) for i in (0, 1)))
    lines = [
        f"# data.curriculum=pool against uniform sampling (easy + learnable + impossible "
        f"prompts, {steps} steps, {len(seeds)} seeds)",
        "",
        f"`python bench/curriculum.py --steps {steps} --seeds {' '.join(map(str, seeds))}`",
        "",
        f"Curves smoothed over {SMOOTH} validations in a row. All seeds averaged: target "
        f"(uniform's last) {pooled['target_accuracy']:.3f}; samples to it, uniform / pool: "
        f"{reached(pooled)}; **{ratio(pooled)}**.",
        "",
        "| seed | uniform: held-out by step | pool: held-out by step | target (uniform's last, "
        "smoothed) | samples to it: uniform / pool | ratio | second half's mean: uniform / pool "
        "| pool skipped |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in per_seed:
        uni, pool = s["runs"]
        curve = lambda r: ", ".join(f"{st}: {a:.3f}" for st, _, a in r["curve"])  # noqa: E731
        lines.append(
            f"| {s['seed']} | {curve(uni)} | {curve(pool)} | {s['target_accuracy']:.3f} | "
            f"{reached(s)} | {ratio(s)} | {late_mean(uni['curve']):.3f} / "
            f"{late_mean(pool['curve']):.3f} | {pool['skipped']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def write(results: Path, per_seed: list[dict], steps: int) -> str:
    per_seed = sorted(per_seed, key=lambda s: s["seed"])
    for s in per_seed:  # the reading is recomputed from the curves: one rule for all seeds
        s.update(reading(s["runs"][0]["curve"], s["runs"][1]["curve"]))
    pooled = reading(*(averaged([s["runs"][i]["curve"] for s in per_seed]) for i in (0, 1)))
    text = summary(per_seed, steps)
    saved = {"steps": steps, "smooth": SMOOTH, "seeds": per_seed, "all_seeds": pooled,
             # per seed, in the order of "seeds" (0: the pool never reached the target)
             "samples_ratio_uniform_over_pool": [
                 s["samples_ratio_uniform_over_pool"] for s in per_seed],
             "samples_ratio_uniform_over_pool_all_seeds":
                 pooled["samples_ratio_uniform_over_pool"]}  # fmt: skip
    (results / "curriculum.json").write_text(json.dumps(saved, indent=1) + "\n")
    (results / "curriculum.md").write_text(text)
    plot(per_seed, ROOT / "docs" / "images" / "curriculum.png")
    return text


def plot(per_seed: list[dict], path: Path) -> None:
    """Held-out accuracy against samples generated, smoothed and averaged over the
    seeds, each mode's seeds faint behind it: the docs' figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=120)
    for i, (mode, colour) in enumerate((("uniform (none)", "tab:gray"), ("pool", "tab:blue"))):
        for s in per_seed:
            curve = smoothed(s["runs"][i]["curve"])
            ax.plot([c[1] for c in curve], [c[2] for c in curve], color=colour, alpha=0.15)
        mean = smoothed(averaged([s["runs"][i]["curve"] for s in per_seed]))
        ax.plot([c[1] for c in mean], [c[2] for c in mean], color=colour, lw=2.2, label=mode)
    target = reading(*(averaged([s["runs"][i]["curve"] for s in per_seed]) for i in (0, 1)))
    ax.axhline(target["target_accuracy"], color="black", lw=0.8, ls=":")
    ax.set_xlabel("samples generated")
    ax.set_ylabel(f"held-out accuracy ({SMOOTH} validations)")
    ax.set_title(f"data.curriculum: {len(per_seed)} seeds, mean and each seed", fontsize=10)
    ax.legend(loc="lower right", frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--seeds", type=int, nargs="*", default=[0, 1])
    p.add_argument("--report", action="store_true",
                   help="rewrite curriculum.md from curriculum.json without running")  # fmt: skip
    p.add_argument("--add", action="store_true",
                   help="run --seeds into the saved results instead of replacing them")  # fmt: skip
    args = p.parse_args()
    results = ROOT / "bench" / "results"
    saved = json.loads((results / "curriculum.json").read_text()) if (
        args.report or args.add) else {"steps": args.steps, "seeds": []}  # fmt: skip
    if args.report:
        print(write(results, saved["seeds"], saved["steps"]))
        return
    if args.add and saved["steps"] != args.steps:
        raise SystemExit(f"--add: the saved results ran {saved['steps']} steps; pass --steps "
                         f"{saved['steps']}")  # fmt: skip
    out = ROOT / "bench" / ".runs" / "curriculum"
    out.mkdir(parents=True, exist_ok=True)
    data = write_data(out)
    per_seed = [s for s in saved["seeds"] if s["seed"] not in args.seeds]
    for seed in args.seeds:
        uniform, pool = (run(mode, seed, args.steps, out, data) for mode in ("none", "pool"))
        per_seed.append({"seed": seed, "runs": [uniform, pool]})
    print(write(results, per_seed, args.steps))


if __name__ == "__main__":
    main()
