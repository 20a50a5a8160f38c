"""The built-in agent task two ways: rlpost's episode loop, and an OpenAI-client agent
program through the chat endpoint (``agent.program``), side by side.

    python bench/agent_program_bench.py            # 60 steps each, seed 0
    python bench/agent_program_bench.py --steps 5  # a smoke run

Both runs are ``python -m rlpost.main algo=grpo agent=calculator`` with the same
seed, data, model and steps; the second adds
``agent.program=examples/agents/openai_calculator.py:run``. They share one model
cache, warmed before the first run, so neither pays for the warm-up. Reported
per run: held-out greedy accuracy at step 0 and after the last step, the run's
wall time, the mean step time and generation time over steps 2..N, and the
largest trainer-vs-rollout log-prob difference (``rollout/logprob_abs_diff_max``).

Writes bench/results/agent_program.md and bench/results/agent_program.json; the
runs stay in bench/.runs/agent-program-<time>/.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT / "bench"))

from timed_cli import timed_cli  # noqa: E402

PROGRAM = "agent.program=examples/agents/openai_calculator.py:run"


def run(name: str, extra: list[str], steps: int, out: Path, cache: Path) -> dict:
    run_dir = out / name
    wall = timed_cli([
        "algo=grpo", "agent=calculator", f"trainer.total_steps={steps}", "trainer.val_every=0",
        "trainer.seed=0", f"model.cache_dir={cache}", f"trainer.run_dir={run_dir}", *extra,
    ], out, name)  # fmt: skip
    history = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    val = [h["val/accuracy"] for h in history if "val/accuracy" in h]
    trained = [h for h in history if h["step"] > 1]
    return {
        "run": name,
        "accuracy_start": val[0],
        "accuracy_end": val[-1],
        "wall_s": wall,
        "step_s": sum(h["timing/step_s"] for h in trained) / max(len(trained), 1),
        "generate_s": sum(h["timing/generate_s"] for h in trained) / max(len(trained), 1),
        "logprob_abs_diff_max": max(
            h["rollout/logprob_abs_diff_max"] for h in history if h["step"]
        ),
        "prefix_breaks": sum(h.get("agent/prefix_breaks", 0.0) for h in history),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--cache", type=Path, help="a model cache to reuse (default: a new one)")
    args = parser.parse_args()
    out = ROOT / "bench" / ".runs" / f"agent-program-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True)
    cache = args.cache or out / "model-cache"
    run("warmup", ["trainer.total_steps=1"], 1, out, cache)  # fills the cache (or finds it)
    rows = [run("native loop", [], args.steps, out, cache)]
    rows.append(run("agent.program (OpenAI client)", [PROGRAM], args.steps, out, cache))
    lines = [
        f"agent=calculator, {args.steps} steps of 16 prompts x 8 episodes, seed 0, warm model cache",
        "",
        "| run | held-out acc. step 0 | after | wall time | step s | generate s | logprob diff max |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['accuracy_start']:.3f} | {r['accuracy_end']:.3f} | "
            f"{r['wall_s'] / 60:.1f} min | {r['step_s']:.2f} | {r['generate_s']:.2f} | "
            f"{r['logprob_abs_diff_max']:.1e} |"
        )
    native, program = rows
    lines += [
        "",
        f"agent.program's step time / the native loop's: {program['step_s'] / native['step_s']:.2f}x",
    ]
    table = "\n".join(lines)
    print(table)
    if args.steps >= 60:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "agent_program.md").write_text(
            "# The built-in agent task: native loop vs an OpenAI-client agent program\n\n"
            "`python bench/agent_program_bench.py`\n\n" + table + "\n"
        )
        (RESULTS / "agent_program.json").write_text(json.dumps({"runs": rows}, indent=2) + "\n")
    print(f"runs in {out}")


if __name__ == "__main__":
    main()
