"""The stat loggers a vLLM engine is given: a per-engine counter of prefix-cache
and KV-connector hits (what ``VLLMEngine.stats()`` reports), and a stand-in for
vLLM's Prometheus logger that records nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm.v1.metrics.stats import IterationStats, MultiModalCacheStats, SchedulerStats


class PrefixCacheCounter:
    """Totals of vLLM's per-step prefix-cache stats (prompt tokens looked up / found cached).

    Handed to vLLM as a per-engine stat logger (the factory returns this one
    object), so the totals belong to this engine even with several in a process.
    """

    def __init__(self) -> None:
        self.queries = 0
        self.hits = 0
        # Prompt tokens a KV connector was asked for / supplied (PD decode side).
        self.kv_queries = 0
        self.kv_hits = 0
        # Requests the scheduler preempted (KV cache full: recomputed later), in all,
        # and the highest share of the KV cache in use since ``take_peak``.
        self.preemptions = 0
        self.kv_usage_peak = 0.0

    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        mm_cache_stats: MultiModalCacheStats | None = None,
        engine_idx: int = 0,
    ) -> None:
        stats = getattr(scheduler_stats, "prefix_cache_stats", None)
        if stats is not None:
            self.queries += stats.queries
            self.hits += stats.hits
        if scheduler_stats is not None:
            self.kv_usage_peak = max(self.kv_usage_peak, scheduler_stats.kv_cache_usage)
        if iteration_stats is not None:
            self.preemptions += iteration_stats.num_preempted_reqs
        kv = getattr(scheduler_stats, "connector_prefix_cache_stats", None)
        if kv is not None:
            self.kv_queries += kv.queries
            self.kv_hits += kv.hits

    def take_peak(self) -> float:
        """The KV cache's peak use since the last call."""
        peak, self.kv_usage_peak = self.kv_usage_peak, 0.0
        return peak

    def log_engine_initialized(self) -> None:
        pass

    def log(self) -> None:
        pass

    def record_sleep_state(self, is_awake: int, level: int) -> None:
        pass


def no_prometheus() -> type[PrometheusStatLogger]:
    """A stand-in for vLLM's Prometheus stat logger, which the engine adds unless
    given one: nothing reads its metrics here, and recording them took ~10 % of a
    short-completion batch on the CPU (the prefix-cache counter needs the stats on)."""
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    class NoPrometheus(PrometheusStatLogger):
        def __init__(
            self, vllm_config: VllmConfig, engine_indexes: list[int] | None = None
        ) -> None:
            pass

        def record(self, *args: object, **kwargs: object) -> None:
            pass

        def record_sleep_state(self, *args: object, **kwargs: object) -> None:
            pass

        def record_admission_rejection(self, *args: object, **kwargs: object) -> None:
            pass

        def log_engine_initialized(self) -> None:
            pass

        def log(self) -> None:
            pass

    return NoPrometheus
