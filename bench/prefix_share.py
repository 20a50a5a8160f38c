"""What prefix sharing saves the trainer: ``trainer.prefix_sharing`` off and on,
side by side, on the FSDP2 engine and the ``model=small`` preset (~30 M parameters).

    python bench/prefix_share.py            # three workloads, 3 timed updates each
    python bench/prefix_share.py --reps 1   # a smoke run

Workloads (token ids random; what matters is which samples begin alike):

- long_prompts: 2 prompts of 256 tokens, ``rollout.n=8`` samples of 32 tokens each,
  one micro-batch of 16 samples;
- agent_segments: 4 agent episodes split at each turn into 4 segments (a prompt of
  128 tokens, then turns of 32 model and 32 tool tokens; segment k holds the
  episode up to its k-th answer), one micro-batch of 16 segments;
- default_task: the built-in task's shape and model (``tiny``: 32 prompts of 24
  tokens x 8 samples of 8 tokens, micro-batches of 64), where ``auto`` decides.

For each: the median seconds of ``update_policy`` (forward, backward and the
optimizer step over the batch) and of ``logprobs``, after one untimed update,
the unshared engine as a run has it by default (padded rows; packing into one
row costs more on the CPU, whose attention then spans every sample), and the
update's tokens/s (the samples' tokens over its seconds). Writes
bench/results/prefix_share.json and prefix_share.md.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from transformers import Qwen2ForCausalLM  # noqa: E402

from rlpost.algos import PolicyLossConfig  # noqa: E402
from rlpost.models.tiny import build_config, build_tokenizer  # noqa: E402
from rlpost.trainers.batch import TrajectoryBatch, pad_sequences  # noqa: E402
from rlpost.trainers.fsdp.engine import FSDPEngine, FSDPEngineConfig  # noqa: E402
from rlpost.trainers.micro_batching import row_lengths  # noqa: E402
from rlpost.trainers.prefix_sharing import share_prefixes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results"


def _batch(ids: list[list[int]], resp: list[list[int]]) -> TrajectoryBatch:
    batch = TrajectoryBatch(
        input_ids_bt=pad_sequences(ids, 0),
        attention_mask_bt=pad_sequences([[1] * len(s) for s in ids], 0),
        response_mask_bt=pad_sequences(resp, 0),
    )
    g = torch.Generator().manual_seed(1)
    batch.advantages_bt = torch.randn(len(ids), generator=g)[:, None] * batch.response_mask_bt
    return batch


def long_prompts(
    g: torch.Generator, prompts: int = 2, n: int = 8, p: int = 256, r: int = 32
) -> TrajectoryBatch:
    ids, resp = [], []
    for _ in range(prompts):
        prompt = torch.randint(20, 90, (p,), generator=g).tolist()
        for _ in range(n):
            ids.append(prompt + torch.randint(20, 90, (r,), generator=g).tolist())
            resp.append([0] * p + [1] * r)
    return _batch(ids, resp)


def agent_segments(
    g: torch.Generator, episodes: int = 4, turns: int = 4, p: int = 128, a: int = 32, tool: int = 32
) -> TrajectoryBatch:
    ids, resp = [], []
    for _ in range(episodes):
        tokens = torch.randint(20, 90, (p,), generator=g).tolist()
        mask = [0] * p
        for _ in range(turns):
            tokens = tokens + torch.randint(20, 90, (a,), generator=g).tolist()
            mask = mask + [1] * a
            ids.append(list(tokens))
            resp.append(list(mask))
            tokens = tokens + torch.randint(20, 90, (tool,), generator=g).tolist()
            mask = mask + [0] * tool
    return _batch(ids, resp)


def default_task(g: torch.Generator) -> TrajectoryBatch:
    return long_prompts(g, prompts=32, n=8, p=24, r=8)


# name -> (batch, micro-batch size, model preset, the two modes compared)
WORKLOADS = {
    "long_prompts": (long_prompts, 16, "small", ("off", "on")),
    "agent_segments": (agent_segments, 16, "small", ("off", "on")),
    "default_task": (default_task, 64, "tiny", ("off", "auto")),
}


def model_dir(root: Path, preset: str) -> str:
    """A random-weight tiny-family model with room for 512 positions (the long
    prompts' 288; the presets hold 256)."""
    tokenizer = build_tokenizer()
    config = build_config(preset, tokenizer)
    config.max_position_embeddings = 512
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).float().save_pretrained(root / preset)
    tokenizer.save_pretrained(root / preset)
    return str(root / preset)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(
    path: str, batch: TrajectoryBatch, micro: int, sharing: str, reps: int, port: int
) -> dict:
    cfg = FSDPEngineConfig(
        model_path=path, lr=1e-5, lr_warmup_steps=0, micro_batch_size=micro,
        prefix_sharing=sharing, threads=os.cpu_count() or 1,
    )  # fmt: skip
    eng = FSDPEngine(cfg, 0, 1, f"tcp://127.0.0.1:{port}")
    batch.old_logp_bt = eng.logprobs(batch)
    eng.update_policy(batch, PolicyLossConfig())  # untimed: first-call costs
    updates, logprobs = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        eng.logprobs(batch)
        t1 = time.perf_counter()
        eng.update_policy(batch, PolicyLossConfig())
        t2 = time.perf_counter()
        logprobs.append(t1 - t0)
        updates.append(t2 - t1)
    tokens = sum(row_lengths(batch))
    run = eng._sharing.tokens_run
    shared = run / eng._sharing.tokens_unshared if run else 1.0
    del eng
    update_s = statistics.median(updates)
    return {
        "update_s": update_s, "logprobs_s": statistics.median(logprobs),
        "tokens": tokens, "tokens_per_s": tokens / update_s, "tokens_run_share": shared,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    results: dict = {"reps": args.reps, "threads": os.cpu_count(), "workloads": {}}
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        for name, (make, micro, preset, modes) in WORKLOADS.items():
            path = model_dir(Path(tmp), preset)
            batch = make(torch.Generator().manual_seed(0))
            saved = share_prefixes(batch.input_ids_bt, row_lengths(batch)).saved
            rows = {mode: measure(path, batch, micro, mode, args.reps, port) for mode in modes}
            base, shared = rows[modes[0]], rows[modes[1]]
            results["workloads"][name] = {
                "samples": len(batch), "micro_batch_size": micro, "model": preset,
                "saved_tokens_share": saved,
                "modes": rows, "update_speedup": base["update_s"] / shared["update_s"],
                "logprobs_speedup": base["logprobs_s"] / shared["logprobs_s"],
            }  # fmt: skip
            print(name, json.dumps(results["workloads"][name]), flush=True)
    w = results["workloads"]
    results["update_speedup_long_prompts"] = w["long_prompts"]["update_speedup"]
    results["update_speedup_agent_segments"] = w["agent_segments"]["update_speedup"]
    results["update_speedup_default_task_auto"] = w["default_task"]["update_speedup"]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "prefix_share.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        "# trainer.prefix_sharing: the update with and without shared prefixes",
        "",
        f"`python bench/prefix_share.py --reps {args.reps}` (FSDP2 engine, one rank, "
        f"{results['threads']} threads, float32; medians of {args.reps} calls)",
        "",
        "| workload | model | samples | tokens | prefix_sharing | tokens run | update s | update tokens/s | log-probs s | update speed-up |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in w.items():
        for mode, m in r["modes"].items():
            speed = f"**{r['update_speedup']:.2f}x**" if mode != "off" else ""
            lines.append(
                f"| {name} | {r['model']} | {r['samples']} | {m['tokens']} | {mode} | {m['tokens_run_share']:.0%} | "
                f"{m['update_s']:.3f} | {m['tokens_per_s']:,.0f} | {m['logprobs_s']:.3f} | {speed} |"
            )
    (OUT / "prefix_share.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
