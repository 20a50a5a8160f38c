"""rlpost's GRPO against TRL's GRPOTrainer, and against the machine's limit.

One command, on the CPU, on the built-in arithmetic task, two workloads:

    python bench/compare_trl.py                        # both workloads (below)
    python bench/compare_trl.py --workload old         # tiny model, 8x8 and 32x8, 3 repeats
    python bench/compare_trl.py --workload realistic   # small model, 100 tokens, 32x8
                                                       # (float32, then bf16 on every side)
    python bench/compare_trl.py --quick                # a smoke run of both (small batches)

The realistic workload (trl_compare/realistic.py) starts every side from the
built-in 30 M-parameter `small` model with completions forced to 100 tokens;
its sides are rlpost sync and one_step_off, TRL with transformers generation
and TRL with vLLM colocate. The old workload is described here:

Both frameworks start from the same files: rlpost's warmed-up built-in model
is copied once into the run directory and passed to each as a local path. They
train on the same prompts in the same order (rlpost's seeded prompt stream,
handed to TRL as an unshuffled dataset), with the same batch (prompts per step
x samples per prompt, micro-batches of ``--micro-batch`` samples), completion
length, temperature, learning rate (constant, no warm-up), AdamW betas,
gradient clipping and loss: GRPO's clipped ratio (0.2) on group-normalised
advantages, token-mean over the global batch (TRL ``loss_type="dapo"``), no KL.
The reward is rlpost's ``rlpost.data.tasks.arith.correctness`` in both (TRL's worker
loads that file). Each repeat runs rlpost sync, TRL (torch's default threads),
rlpost one_step_off and TRL with one thread, in reverse order every other
repeat; the table reports medians.

Measured per run:

- step time: wall clock from the end of one step to the end of the next, over
  steps 2..N (step 1 carries one-off warm-up costs). rlpost: when each step's
  line lands in ``metrics.jsonl`` (polled every 20 ms; the final validation,
  ``timing/val_s``, is subtracted from the last step); TRL: a ``TrainerCallback``.
- generated tokens per second: completion tokens of the step (up to and
  including the end token) / step time.
- peak memory: the largest sum of proportional set size (PSS, shared pages
  split between the processes that map them) over the whole process tree of the
  run (for rlpost: the CLI, Ray's GCS, raylet and dashboard processes and every
  Ray worker, all descendants of the CLI), sampled every 0.2 s. Peak summed RSS
  (counts shared pages once per process) is reported beside it.
- held-out accuracy: the bench's own greedy decoding with transformers of each
  run's saved final model on the task's held-out prompts (same code for both).

The limit: in a separate process, raw vLLM generation of the same batch
(``vllm.LLM`` in-process with the engine settings of rlpost's replica, same
n / max_tokens / temperature, sampled-token log-probs) and a raw
transformers forward+backward+AdamW step on the generated tokens with the same
micro-batching, each at 1 and 2 torch threads; the faster is the limit. The
ratios are rlpost's step time over (gen + train) for ``sync`` and over
max(gen, train) for ``one_step_off``.

Each workload rewrites its own section of bench/RESULTS.md and its object in
bench/results/compare_trl.json; per-run logs, metrics and models stay in
bench/.runs/<time>-<workload>/ (``--report DIR`` rewrites them from one). The
old workload's TRL runs in its own virtual environment, bench/.venv-trl (torch
2.13.0 CPU + the TRL pip picks); the realistic one's in bench/.venv-trl-vllm
(rlpost's packages + TRL, so TRL can drive rlpost's vLLM). Both are created on
first use. bench/README.md describes the method; the code is in trl_compare/.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trl_compare import common
from trl_compare.common import REPO, RESULTS, RESULTS_JSON


def main(argv: list[str] | None = None) -> int:
    assert __doc__ is not None
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=("both", "old", "realistic"), default="both")
    p.add_argument(
        "--quick",
        action="store_true",
        help="old: 8x8, 3 steps, 1 repeat; realistic: 4x2, 16 tokens",
    )
    p.add_argument("--steps", type=int, default=10, help="old workload: steps per run")
    p.add_argument("--repeats", type=int, default=3, help="old workload: repeats of every run")
    p.add_argument(
        "--batches", default="8x8,32x8", help="old workload: prompts x samples, comma-separated"
    )
    p.add_argument("--max-tokens", type=int, default=8, help="old workload: most completion tokens")
    p.add_argument(
        "--real-steps",
        type=int,
        default=3,
        help="realistic workload: steps per side (the first is warm-up)",
    )
    p.add_argument("--real-batch", default="32x8", help="realistic workload: prompts x samples")
    p.add_argument(
        "--real-tokens",
        type=int,
        default=100,
        help="realistic workload: tokens per completion (forced)",
    )
    p.add_argument(
        "--real-precision",
        default="float32,bf16",
        help="realistic workload: float32, bf16 or both (comma-separated), one run of every side each",
    )
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--micro-batch", type=int, default=64)
    p.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--json-out", type=Path, default=RESULTS_JSON)
    p.add_argument(
        "--rlpost-src",
        type=Path,
        default=REPO,
        help="rlpost checkout to benchmark (default: this one), e.g. a `git archive` of a commit",
    )
    p.add_argument("--report", type=Path, help="rewrite the results from a run dir in bench/.runs")
    p.add_argument("--trl-worker", help=argparse.SUPPRESS)
    p.add_argument("--raw-worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.trl_worker:  # in TRL's venv: nothing of rlpost's is importable there
        from trl_compare.workers import trl_worker

        trl_worker(args.trl_worker)
        return 0
    if args.raw_worker:
        from trl_compare.workers import raw_worker

        raw_worker(args.raw_worker)
        return 0

    from trl_compare.old import run_old, write_old
    from trl_compare.realistic import run_realistic, write_realistic

    if args.report:
        runs = [json.loads(x) for x in (args.report / "runs.jsonl").read_text().splitlines()]
        meta = json.loads((args.report / "meta.json").read_text())
        raw = json.loads((args.report / "raw.json").read_text())
        if meta.get("workload", "old") == "old":
            write_old(args.out, args.json_out, meta, runs, raw)
        else:
            write_realistic(args, meta, runs, raw)
        return 0
    if args.quick:
        args.steps, args.repeats, args.batches = 3, 1, "8x8"
    common.SRC = args.rlpost_src.resolve()
    sys.path.insert(0, str(common.SRC))
    command = " ".join(["python bench/compare_trl.py", *(sys.argv[1:] if argv is None else argv)])
    if args.workload in ("both", "realistic"):
        run_realistic(args, command)
    if args.workload in ("both", "old"):
        run_old(args, command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
