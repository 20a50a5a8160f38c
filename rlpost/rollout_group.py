"""N rollout replicas behind one router, called like one engine.

Requests without a session id go to the replica with the fewest requests in
flight; requests with one go by consistent hashing of the id, so every turn
of a conversation reaches the replica whose prefix cache holds it (see
``rollout/router.py``). All requests are in flight at once: each is its own
call to an asyncio actor, so a replica batches whatever it has.

    group = RolloutGroup.from_config(cfg, model_path, device)
    pending = group.generate_async(requests)   # returns at once
    ...                                        # e.g. train on the previous batch
    results = pending.result()                 # input order
    seconds = group.load_weights(weights_ref)  # one object-store copy for all
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ray

from rlpost.workers.rollout_worker import RolloutWorker
from rollout.base import GenerationRequest, GenerationResult
from rollout.router import Router


class PendingGeneration:
    """Requests in flight on the replicas; ``result()`` waits for all of them."""

    def __init__(self, group: RolloutGroup, requests: list[GenerationRequest]):
        self.group = group
        self.requests = requests
        self._calls = [group._submit(r) for r in requests]  # (replica, ref) per request
        self._results: list[GenerationResult] | None = None

    def done(self) -> bool:
        """True once every request has finished (never blocks)."""
        if self._results is not None:
            return True
        refs = [ref for _, ref in self._calls]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        return len(ready) == len(refs)

    def result(self) -> list[GenerationResult]:
        """Results in input order. A request whose replica died is retried on another."""
        if self._results is None:
            self._results = [self.group._collect(r, c) for r, c in zip(self.requests, self._calls)]
        return self._results


class RolloutGroup:
    """``replicas`` rollout actors (engine ``engine``: vllm or hf) and their router.

    Replica ``i`` gets seed ``engine_cfg.seed + i``, so requests without an
    explicit seed do not draw the same samples on every replica.
    ``scheduling`` (one Ray scheduling strategy per replica) says where each
    runs; None lets Ray choose.
    """

    def __init__(
        self,
        engine_cfg: Any,
        replicas: int = 1,
        num_cpus: float = 1.0,
        threads: int = 1,
        device_opts: dict | None = None,
        engine: str = "vllm",
        scheduling: list[Any] | None = None,
        vnodes: int = 128,
    ):
        cls = ray.remote(num_cpus=num_cpus, **(device_opts or {}))(RolloutWorker)
        where = scheduling or [None] * replicas
        assert len(where) == replicas, "one scheduling strategy per replica"
        self.workers: list[Any] = [
            cls.options(scheduling_strategy=s).remote(
                dataclasses.replace(engine_cfg, seed=engine_cfg.seed + i), threads, engine
            )
            for i, s in enumerate(where)
        ]
        try:
            ray.get([w.ready.remote() for w in self.workers])
        except Exception:
            self.close()
            raise
        self.router = Router(replicas, vnodes)
        self._last_cache: list[tuple[float, float]] = [(0.0, 0.0)] * replicas

    @classmethod
    def from_config(cls, cfg: Any, model_path: str, device: Any) -> RolloutGroup:
        """The group ``cfg.rollout`` describes (``cfg``: an ``rlpost.config.Config``;
        ``device``: an ``rlpost.device.DeviceSpec``)."""
        return cls(
            engine_config(cfg, model_path, device.kind),
            replicas=cfg.rollout.replicas,
            num_cpus=cfg.rollout.num_cpus,
            threads=cfg.trainer.threads,
            device_opts=device.ray_resource,
            engine=cfg.rollout.name,
        )

    # -- generation --------------------------------------------------------

    def generate_async(self, requests: list[GenerationRequest]) -> PendingGeneration:
        """Send every request now; collect with ``.result()``."""
        return PendingGeneration(self, requests)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Generate and wait; results in input order."""
        return self.generate_async(requests).result()

    def _submit(self, request: GenerationRequest) -> tuple[int, ray.ObjectRef]:
        replica = self.router.pick(request.session_id)
        self.router.begin(replica)
        return replica, self.workers[replica].generate_one.remote(request)

    def _collect(self, request: GenerationRequest, call: tuple[int, ray.ObjectRef]) -> Any:
        while True:
            replica, ref = call
            try:
                return ray.get(ref)
            except ray.exceptions.RayActorError:
                # Its sessions fall to the next replica on the ring; once none
                # is left, pick raises.
                self.router.mark_unhealthy(replica)
                call = self._submit(request)
            finally:
                self.router.end(replica)

    # -- weights, health, stats --------------------------------------------

    def load_weights(self, weights: Any) -> float:
        """Load new weights into every replica; returns the wall seconds.

        ``weights``: an ObjectRef to a list of ``(hf_name, tensor)`` (e.g.
        ``TrainerGroup.weights_ref()``), or the list itself, which is put in
        the object store once. Each replica fetches the one stored copy, waits
        for its requests in flight to finish, loads, and resumes.
        """
        import time

        start = time.perf_counter()
        ref = weights if isinstance(weights, ray.ObjectRef) else ray.put(weights)
        ray.get([w.load_weights.remote(ref) for w in self.workers])
        return time.perf_counter() - start

    def load_lora_adapter(self, adapter: Any) -> float:
        """Serve later requests with this LoRA adapter (``rollout.lora_sync=adapter``).

        ``adapter``: an ObjectRef to ``(tensors, peft_config)`` as the trainer's
        ``adapter_weights()`` returns them; every replica fetches the one copy.
        """
        import time

        start = time.perf_counter()
        ref = adapter if isinstance(adapter, ray.ObjectRef) else ray.put(adapter)
        ray.get([w.load_lora_adapter.remote(ref) for w in self.workers])
        return time.perf_counter() - start

    def check_health(self, timeout_s: float = 10.0) -> list[bool]:
        """Ping every replica; mark each healthy or not by whether it answers."""
        refs = [w.ready.remote() for w in self.workers]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        alive = []
        for i, ref in enumerate(refs):
            ok = False
            if ref in ready:
                try:
                    ok = bool(ray.get(ref))
                except ray.exceptions.RayError:
                    ok = False
            (self.router.mark_healthy if ok else self.router.mark_unhealthy)(i)
            alive.append(ok)
        return alive

    def stats(self) -> dict[str, float]:
        """Per-replica metrics; the prefix-cache hit rate is over the tokens
        looked up since the previous ``stats()`` call (so one per step)."""
        out: dict[str, float] = {}
        engine_stats = ray.get([w.stats.remote() for w in self.workers])
        queries = hits = 0.0
        for i, s in enumerate(engine_stats):
            last_q, last_h = self._last_cache[i]
            dq, dh = s["prefix_cache_queries"] - last_q, s["prefix_cache_hits"] - last_h
            self._last_cache[i] = (s["prefix_cache_queries"], s["prefix_cache_hits"])
            queries, hits = queries + dq, hits + dh
            out[f"rollout/replica{i}/requests"] = float(self.router.requests[i])
            out[f"rollout/replica{i}/prefix_cache_hit_rate"] = dh / dq if dq else 0.0
        out["rollout/prefix_cache_hit_rate"] = hits / queries if queries else 0.0
        return out

    def reset_prefix_cache(self) -> None:
        """Empty every replica's prefix cache (e.g. between benchmark runs)."""
        ray.get([w.reset_prefix_cache.remote() for w in self.workers])

    def served(self) -> list[list[tuple[str | None, str]]]:
        """Per replica, ``(session_id, prompt_hash)`` of each request it received."""
        return ray.get([w.served.remote() for w in self.workers])

    def close(self) -> None:
        for w in self.workers:
            ray.kill(w)
        self.workers = []


def engine_config(cfg: Any, model_path: str, device_kind: str) -> Any:
    """The engine config for ``cfg.rollout.name`` from the run config."""
    r = cfg.rollout
    if r.name == "hf":
        from rollout.hf import HFEngineConfig

        return HFEngineConfig(
            model_path=model_path,
            dtype=cfg.model.dtype,
            max_model_len=r.max_model_len,
            seed=cfg.trainer.seed,
            device=device_kind,
        )
    from rollout.vllm import VLLMEngineConfig

    return VLLMEngineConfig(
        model_path=model_path,
        dtype=cfg.model.dtype,
        max_model_len=r.max_model_len,
        kv_cache_gib=r.kv_cache_gib,
        gpu_memory_utilization=r.gpu_memory_utilization,
        enforce_eager=r.enforce_eager,
        seed=cfg.trainer.seed,
        device=device_kind,
        block_size=r.block_size,
        lora=cfg.model.lora.rank if r.lora_sync == "adapter" else 0,
    )
