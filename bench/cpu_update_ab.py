"""rlpost's sync GRPO step on the CPU, this checkout against another commit, on
``bench/compare_trl.py``'s realistic workload (the 30 M ``small`` model, 32 x 8
completions of 100 tokens, micro-batches of 64): the before-and-after of a change
to the trainer or the rollout, on one machine, one after the other.

    git archive <commit> | tar -x -C /tmp/before
    python bench/cpu_update_ab.py --before /tmp/before --model <model dir> [--precision bf16]

``--model``: a model directory both sides load (``bench/compare_trl.py`` leaves one
in ``bench/.runs/<run>/model``). Prints each side's per-step update, generation and
step times over steps 2..N and their medians, and writes them to
``bench/results/cpu_update_ab.md``. Compare the medians with the machine's limit in
``bench/RESULTS.md`` (raw generation + raw training of the same batch).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def main() -> None:
    from trl_compare import common
    from trl_compare.realistic import realistic_setup
    from trl_compare.sides import run_rlpost

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", type=Path, required=True, help="an rlpost source tree")
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--precision", default="bf16", choices=["bf16", "float32"])
    p.add_argument("--steps", type=int, default=5, help="the first is warm-up")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cpu_update_ab.md")
    a = p.parse_args()
    args = argparse.Namespace(
        real_batch="32x8", real_tokens=100, real_steps=a.steps, lr=1e-4, micro_batch=64,
        quick=False,
    )  # fmt: skip
    batch, setup = realistic_setup(args, a.precision)
    lines = [
        "# The sync step on the CPU, before and after",
        "",
        f"`python bench/cpu_update_ab.py --before {a.before} --model {a.model} "
        f"--precision {a.precision}`, {time.strftime('%Y-%m-%d %H:%M %Z')}; steps 2..{a.steps}.",
        "",
        "| side | update s | generate s | step s | median step s |",
        "| --- | --- | --- | --- | --- |",
    ]
    for label, src in (("before", a.before), ("after", ROOT)):
        common.SRC = src.resolve()
        out = Path(f"/tmp/rlpost-ab-{label}-{time.strftime('%H%M%S')}")
        run_rlpost({"model": str(a.model)}, batch, setup, "sync", out, 3600)
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        steps = [m for m in rows if "timing/update_s" in m][1:]
        cols = [
            [round(m[k], 2) for m in steps]
            for k in ("timing/update_s", "timing/generate_s", "timing/step_s")
        ]
        median = statistics.median(cols[2])
        print(label, cols, median, flush=True)
        lines.append(f"| {label} ({src}) | {cols[0]} | {cols[1]} | {cols[2]} | {median:.2f} |")
    a.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
