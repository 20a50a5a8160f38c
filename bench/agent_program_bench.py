"""The built-in agent task by every route an agent reaches the policy: rlpost's own
episode loop, and agent programs through the endpoint's Chat Completions,
Anthropic Messages and OpenAI Responses routes, and the built-in loop with its
tool served by an MCP server, side by side.

    python bench/agent_program_bench.py                 # every route, 60 steps, seed 0
    python bench/agent_program_bench.py --steps 30      # the overhead ratios in half the time
    python bench/agent_program_bench.py --routes native messages --steps 5   # a smoke run

Every run is ``python -m rlpost.main algo=grpo agent=calculator`` with the same
seed, data, model and steps; the routes add:

- ``native``: nothing (rlpost's episode loop, the built-in multiply tool);
- ``chat``: ``agent.program=examples/agents/openai_calculator.py:run`` (the
  ``openai`` client, ``/v1/chat/completions``);
- ``messages``: ``agent.program=examples/agents/anthropic_calculator.py:run`` (the
  ``anthropic`` client, ``/v1/messages``);
- ``responses``: ``agent.program=examples/agents/openai_agents_calculator.py:run``
  (the OpenAI Agents SDK, its default ``OpenAIResponsesModel``: ``/v1/responses``);
- ``mcp``: ``agent.tools=[mcp:examples/agents/mcp_multiply_server.py]
  agent.mcp_sessions=run`` (the tool served over MCP stdio, one session per
  batch of episodes).

They share one model cache, warmed before the first run, so none pays for the
warm-up. Reported per run: held-out greedy accuracy at step 0 and after the last
step, the run's wall time, the mean step time and generation time over steps
2..N and their ratio to ``native``'s (the route's overhead), and the largest
trainer-vs-rollout log-prob difference (``rollout/logprob_abs_diff_max``).

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

ROUTES = {
    "native": [],
    "chat": ["agent.program=examples/agents/openai_calculator.py:run"],
    "messages": ["agent.program=examples/agents/anthropic_calculator.py:run"],
    "responses": ["agent.program=examples/agents/openai_agents_calculator.py:run"],
    "mcp": ["agent.tools=[mcp:examples/agents/mcp_multiply_server.py]", "agent.mcp_sessions=run"],
}
CLIENTS = ("openai", "anthropic", "openai-agents", "mcp")


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
    import importlib.metadata

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--routes", nargs="*", default=list(ROUTES), choices=list(ROUTES))
    parser.add_argument("--cache", type=Path, help="a model cache to reuse (default: a new one)")
    args = parser.parse_args()
    out = ROOT / "bench" / ".runs" / f"agent-program-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True)
    cache = args.cache or out / "model-cache"
    run("warmup", ["trainer.total_steps=1"], 1, out, cache)  # fills the cache (or finds it)
    rows = [run(route, ROUTES[route], args.steps, out, cache) for route in args.routes]
    native = next((r for r in rows if r["run"] == "native"), None)
    versions = {c: importlib.metadata.version(c) for c in CLIENTS}
    lines = [
        f"agent=calculator, {args.steps} steps of 16 prompts x 8 episodes, seed 0, warm model "
        "cache; clients " + ", ".join(f"{k} {v}" for k, v in versions.items()),
        "",
        "| route | held-out acc. step 0 | after | wall time | step s | vs native | generate s "
        "| logprob diff max | prefix breaks |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        r["step_ratio"] = r["step_s"] / native["step_s"] if native else None
        ratio = f"{r['step_ratio']:.2f}x" if r["step_ratio"] is not None else ""
        lines.append(
            f"| {r['run']} | {r['accuracy_start']:.3f} | {r['accuracy_end']:.3f} | "
            f"{r['wall_s'] / 60:.1f} min | {r['step_s']:.2f} | {ratio} | {r['generate_s']:.2f} | "
            f"{r['logprob_abs_diff_max']:.1e} | {r['prefix_breaks']:.0f} |"
        )
    table = "\n".join(lines)
    print(table)
    RESULTS.mkdir(exist_ok=True)
    command = (
        "python bench/agent_program_bench.py"
        + (f" --steps {args.steps}" if args.steps != 60 else "")
        + (f" --routes {' '.join(args.routes)}" if args.routes != list(ROUTES) else "")
    )
    (RESULTS / "agent_program.md").write_text(
        "# The built-in agent task by every route: native loop, endpoint routes, MCP\n\n"
        f"`{command}`\n\n" + table + "\n"
    )
    (RESULTS / "agent_program.json").write_text(
        json.dumps({"steps": args.steps, "clients": versions, "runs": rows}, indent=2) + "\n"
    )
    print(f"runs in {out}")


if __name__ == "__main__":
    main()
