"""One rank's FSDP2 groups: the bf16 policy update's time with a group per decoder
layer against groups of several layers (``rlpost.trainers.fsdp.common.layer_groups``).

On one rank FSDP2 overlaps nothing with communication, and every group runs its
hooks in each micro-batch's forward and backward. This measures what those hooks
cost where nothing else does: a model of the 0.5B's 24 layers at width 16, so the
arithmetic is negligible and the update's time is the host's, at 32 x (8 + 8)
tokens in micro-batches of 8, bf16 over fp32 master weights
(``mixed_precision=bf16``, the only one-rank setting that shards, with offload).

    python bench/fsdp_groups.py                  # -> bench/results/fsdp_groups.{md,json}
    python bench/fsdp_groups.py --repeats 10 --rounds 6

Each row: layers per group (1: a group per layer, the engine's layout before
grouping; 9: what a GPU's 1 GiB budget makes of the 0.5B's layers, groups of 9, 9
and 6; 24: one group), the median update of all rounds' repeats (each engine
warmed up by one update first) and their spread, and the self-time of FSDP2's and
DTensor's Python functions in one more, profiled, update (median over the rounds):
the wall clock of this machine moves by more than the difference. The rows run in turn,
``--rounds`` times, so a slow minute of the machine does not land on one row.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
RESULTS = ROOT / "bench" / "results"

from gpu_check import SHAPES, random_model_dir, update_batch  # noqa: E402

SHAPE = "deep"
SHAPES[SHAPE] = (16, 24, 2, 1, 32, 1024)  # hidden, layers, heads, kv heads, MLP, vocabulary


def time_updates(model_dir: Path, per_group: int, repeats: int) -> tuple[list[float], float]:
    """``repeats`` timed ``update_policy`` calls (after one warm-up) with ``per_group``
    decoder layers in each FSDP2 group, and the seconds one more update spends in
    FSDP2's and DTensor's own Python code (their functions' self-time under cProfile,
    whose overhead inflates it; the torch ops they call are not counted)."""
    from rlpost.algos import PolicyLossConfig
    from rlpost.trainers.fsdp import common
    from rlpost.trainers.fsdp.engine import FSDPEngine, FSDPEngineConfig

    layer_bytes = 8 * sum(p.numel() for p in _first_layer(model_dir).parameters())
    budget = common.group_budget
    common.group_budget = lambda device_type: per_group * layer_bytes  # type: ignore[assignment]
    try:
        cfg = FSDPEngineConfig(
            model_path=str(model_dir), dtype="float32", mixed_precision="bf16", lr=1e-6,
            lr_warmup_steps=0, micro_batch_size=8, threads=1,
        )  # fmt: skip
        engine = FSDPEngine(cfg, 0, 1, f"file://{tempfile.mkdtemp()}/rendezvous")
    finally:
        common.group_budget = budget  # type: ignore[assignment]
    batch = update_batch(32, 8, 8, SHAPES[SHAPE][-1])
    batch.old_logp_bt = engine.logprobs(batch)
    engine.update_policy(batch, PolicyLossConfig())  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        engine.update_policy(batch, PolicyLossConfig())
        times.append(time.perf_counter() - start)
    profile = cProfile.Profile()
    profile.runcall(engine.update_policy, batch, PolicyLossConfig())
    engine.close()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    fsdp_s = sum(
        tottime
        for (path, _, _), (_, _, tottime, _, _) in stats.items()
        if "distributed/fsdp/_fully_shard" in path or "distributed/tensor/" in path
    )
    return times, fsdp_s


def _first_layer(model_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).model.layers[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--per-group", default="1,9,24", help="layers per group, one row each")
    p.add_argument("--out", type=Path, default=RESULTS / "fsdp_groups")
    args = p.parse_args()
    per_group = [int(k) for k in args.per_group.split(",")]
    times: dict[int, list[float]] = {k: [] for k in per_group}
    hooks: dict[int, list[float]] = {k: [] for k in per_group}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = random_model_dir(SHAPE, Path(tmp) / "m")
        for r in range(args.rounds):
            for k in per_group:
                got, fsdp_s = time_updates(model_dir, k, args.repeats)
                times[k] += got
                hooks[k].append(fsdp_s)
                print(f"round {r + 1}, {k} layers a group: {got}, FSDP2 {fsdp_s:.3f} s", flush=True)
    base = statistics.median(times[per_group[0]])
    rows = [
        {
            "layers_per_group": k,
            "groups": -(-SHAPES[SHAPE][1] // k),
            "median_s": statistics.median(t),
            "min_s": min(t),
            "max_s": max(t),
            "speedup": base / statistics.median(t),
            "updates": len(t),
            "fsdp_python_s": statistics.median(hooks[k]),
        }  # fmt: skip
        for k, t in times.items()
    ]
    lines = [
        f"One rank, bf16 over fp32, {SHAPES[SHAPE][1]} layers of width {SHAPES[SHAPE][0]}, "
        f"32 x (8 + 8) tokens in micro-batches of 8, 1 CPU thread, torch {torch.__version__}; "
        f"`python bench/fsdp_groups.py --repeats {args.repeats} --rounds {args.rounds}`",
        "",
        "| layers a group | groups | median update s | min-max s | vs a group per layer "
        "| FSDP2 + DTensor Python s an update (cProfile) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['layers_per_group']} | {r['groups']} | {r['median_s']:.3f} | "
            f"{r['min_s']:.3f}-{r['max_s']:.3f} | {r['speedup']:.2f}x | {r['fsdp_python_s']:.3f} |"
        )
    text = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.md").write_text(text)
    Path(f"{args.out}.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    main()
