"""A rollout group's per-step metrics from its replicas' engine counters: request
counts and prefix-cache hit rates per replica and pool, the share of idle replica
time, PD's KV-transfer rate (and the one warning when no KV moves), restarts and
interrupted requests. Engines report cumulative totals; rates here are over the
tokens since the previous call."""

from __future__ import annotations

import logging
import time

from rlpost.rollout.pd import PDEngineConfig, no_transfer_reason
from rlpost.serving.pools import Pool

log = logging.getLogger(__name__)


class ReplicaStats:
    """The engine counters each replica had at the previous ``metrics`` call."""

    def __init__(self, replicas: int, pd: PDEngineConfig | None = None) -> None:
        self.pd = pd
        # Engine counters at the previous call: prefix cache and KV connector
        # (queries, hits, queries, hits).
        self._last_cache: list[tuple[float, ...]] = [(0.0,) * 4] * replicas
        # Each replica's engine seconds busy at the previous call (perf/rollout_idle_frac).
        self._last_busy: dict[int, float] = {}
        self._last_t = time.perf_counter()
        # PD mode: the longest prompt sent, for the warning when no KV moves (once).
        self.longest_prompt = 0
        self._warned_no_transfer = False

    def saw_prompt(self, length: int) -> None:
        self.longest_prompt = max(self.longest_prompt, length)

    def forget(self, worker: int) -> None:
        """``worker`` was restarted: its new engine counts from zero."""
        self._last_cache[worker] = (0.0,) * 4
        self._last_busy.pop(worker, None)

    def metrics(
        self, engine_stats: dict[int, dict[str, float]], pools: list[Pool], restarts: list[int]
    ) -> dict[str, float]:
        """The group's metrics (see ``RolloutGroup.stats``) from each live replica's
        ``engine_stats`` (by worker index; a replica restarting has none)."""
        out: dict[str, float] = {}
        clock = time.perf_counter()
        busy = {i: s["busy_s"] for i, s in engine_stats.items() if "busy_s" in s}
        if busy and clock > self._last_t:
            # Share of the replicas' time since the last call with nothing to step.
            worked = sum(max(0.0, b - self._last_busy.get(i, 0.0)) for i, b in busy.items())
            idle = 1.0 - worked / ((clock - self._last_t) * len(busy))
            out["perf/rollout_idle_frac"] = min(1.0, max(0.0, idle))
            self._last_busy.update(busy)
        self._last_t = clock
        totals = []  # per pool: (prefix queries, hits, connector queries, hits)
        for pool in pools:
            total = [0.0] * 4
            for k in range(pool.router.num_replicas):
                i = pool.first + k
                delta: tuple[float, ...] = (0.0,) * 4
                if i in engine_stats:
                    s = engine_stats[i]
                    now = (
                        s["prefix_cache_queries"],
                        s["prefix_cache_hits"],
                        s.get("kv_transfer_queries", 0.0),
                        s.get("kv_transfer_hits", 0.0),
                    )
                    delta = tuple(a - b for a, b in zip(now, self._last_cache[i]))
                    self._last_cache[i] = now
                total = [t + d for t, d in zip(total, delta)]
                out[f"rollout/{pool.role}{k}/requests"] = float(pool.router.requests[k])
                out[f"rollout/{pool.role}{k}/prefix_cache_hit_rate"] = _rate(delta[1], delta[0])
            totals.append(total)
        out["rollout/prefix_cache_hit_rate"] = _rate(totals[0][1], totals[0][0])
        if self.pd is not None:
            out["rollout/pd/kv_transfer_rate"] = _rate(totals[-1][3], totals[-1][2])
            if totals[-1][2] and not totals[-1][3] and not self._warned_no_transfer:
                self._warned_no_transfer = True
                log.warning(
                    no_transfer_reason(self.pd.decode, int(totals[-1][2]), self.longest_prompt)
                )
        out["rollout/replica_restarts"] = float(sum(restarts))
        # The engines' pressure (vLLM): requests preempted for KV-cache room, in all,
        # and the fullest replica's peak share of its KV cache since the last call.
        if any("preemptions" in s for s in engine_stats.values()):
            out["rollout/preemptions"] = sum(
                s.get("preemptions", 0.0) for s in engine_stats.values()
            )
            out["rollout/kv_cache_usage_peak"] = max(
                s.get("kv_cache_usage_peak", 0.0) for s in engine_stats.values()
            )
        # Requests a weight load stopped and continued (partial rollout), in all.
        out["rollout/interrupted_requests"] = sum(
            s.get("interrupted", 0.0) for s in engine_stats.values()
        )
        return out


def _rate(hits: float, queries: float) -> float:
    return hits / queries if queries else 0.0
