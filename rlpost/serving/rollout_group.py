"""N rollout replicas behind one router, called like one engine.

Requests without a session id go to the replica with the fewest requests in
flight; requests with one go by consistent hashing of the id, so every turn
of a conversation reaches the replica whose prefix cache holds it (see
``rollout/router.py``). All requests are in flight at once: those routed to
one replica travel in one call to its asyncio actor (``PendingGeneration``),
and a replica batches whatever it has.

    group = RolloutGroup(engine_cfg, replicas=2)
    pending = group.generate_async(requests)   # returns at once
    ...                                        # e.g. train on the previous batch
    results = pending.result()                 # input order
    seconds = group.load_weights(weights_ref)  # one object-store copy for all

PD mode (``engine_cfg`` a ``rlpost.rollout.pd.PDEngineConfig``; ``rollout.pd.enabled``):
the first ``prefill_replicas`` workers are KV producers, the rest KV
consumers. Each request goes to a prefill replica (one greedy token; it
stores the prompt's KV in the connector), then to a decode replica that loads
that KV and samples the completion; ``PDRouter`` keeps a session on one
replica of each pool. Weight loads reach both pools.

A replica that dies (its process killed, out of memory) is replaced: its
requests in flight go to the other replicas at once, a new actor with the
same engine config and placement starts in the background and loads the
group's last weights (and LoRA adapter), and only then does the router send it
requests again. With no other replica left, requests wait for the new one.
``stats()`` reports ``rollout/replica_restarts``.

The replica pools and a request's route through them live in ``pools``, the
metrics ``stats()`` computes from the engines' counters in ``replica_stats``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Concatenate, TypeGuard, TypeVar, overload

import ray

from rlpost.rollout.base import GenerationRequest, GenerationResult
from rlpost.rollout.pd import FILE_CONNECTORS, PDEngineConfig, PDRouter, prefill_request
from rlpost.rollout.router import Router
from rlpost.serving.pending import Hops, PendingGeneration
from rlpost.serving.pools import Pool, route, router_of
from rlpost.serving.replica_stats import ReplicaStats
from rlpost.workers import WORKER_ENV
from rlpost.workers.ray_types import ActorClass, ActorHandle, RayOptions, Scheduling
from rlpost.workers.rollout_worker import Adapter, NamedTensors, RolloutWorker

if TYPE_CHECKING:
    from rlpost.rollout.hf import HFEngineConfig
    from rlpost.rollout.sglang.engine import SGLangEngineConfig
    from rlpost.rollout.sglang.pd import SGLangPDConfig
    from rlpost.rollout.vllm.config import VLLMEngineConfig
    from rlpost.serving.weight_group import CollectiveSync, IpcSync
    from rlpost.workers.trainer_worker import TrainerGroup

    # A replica's engine config (``rlpost.plan.engines.rollout_engine_config``).
    RolloutEngineConfig = (
        VLLMEngineConfig | HFEngineConfig | SGLangEngineConfig | PDEngineConfig | SGLangPDConfig
    )

log = logging.getLogger(__name__)
QUIET = {"env_vars": WORKER_ENV}
T = TypeVar("T")


def replica_env(engine_cfg: object) -> dict[str, dict[str, str]]:
    """A replica's runtime environment: ``WORKER_ENV``, and no ``torch.compile``
    under an eager engine. vLLM 0.32 compiles its sampler's log-prob rank count
    even then, at the first request that asks for log-probs: 2-3 s of every run
    on the CPU. torch reads the variable once, at import; the same switch set on
    a running process holds only in the thread that set it."""
    eager = getattr(getattr(engine_cfg, "prefill", engine_cfg), "enforce_eager", False)
    return {"env_vars": {**WORKER_ENV, **({"TORCH_COMPILE_DISABLE": "1"} if eager else {})}}


class RolloutGroup:
    """``replicas`` rollout actors (engine ``engine``: vllm or hf) and their router.

    Replica ``i`` gets seed ``engine_cfg.seed + i``, so requests without an
    explicit seed do not draw the same samples on every replica.
    ``scheduling`` (one Ray scheduling strategy per replica) says where each
    runs; None lets Ray choose. A replica that dies is restarted up to
    ``max_restarts`` times, then left out. ``wait=False``: the constructor
    returns once the replicas are asked to start; ``wait_ready`` waits for them.
    """

    def __init__(
        self,
        engine_cfg: RolloutEngineConfig,
        replicas: int = 1,
        num_cpus: float = 1.0,
        threads: int = 1,
        device_opts: RayOptions | None = None,
        engine: str = "vllm",
        scheduling: Sequence[Scheduling] | None = None,
        vnodes: int = 128,
        max_restarts: int = 3,
        wait: bool = True,
    ):
        cls: ActorClass = ray.remote(
            num_cpus=num_cpus, runtime_env=replica_env(engine_cfg), **(device_opts or {})
        )(RolloutWorker)
        where: Sequence[Scheduling] = scheduling or [None] * replicas
        assert len(where) == replicas, "one scheduling strategy per replica"
        # PD mode: set only when engine_cfg is a PDEngineConfig.
        self.pd: PDEngineConfig | None = None
        self._own_kv_dir: str | None = None
        self._in_flight: list[ray.ObjectRef] = []
        if _is_sglang_pd(engine_cfg):
            # One actor owns every SGLang server and the router (rollout/sglang/pd.py);
            # it needs prefill + decode GPUs at once, outside the placement bundles.
            gpus = engine_cfg.prefill_replicas + engine_cfg.decode_replicas
            cls = ray.remote(num_cpus=num_cpus, num_gpus=gpus, runtime_env=QUIET)(RolloutWorker)
            engine, replicas, where = "sglang_pd", 1, [None]
            configs: Sequence[RolloutEngineConfig] = [engine_cfg]
        elif isinstance(engine_cfg, PDEngineConfig):
            assert replicas == engine_cfg.replicas, "replicas = prefill_replicas + decode_replicas"
            engine_cfg = self._with_kv_dir(engine_cfg)
            self.pd = engine_cfg
            configs = [engine_cfg.prefill] * engine_cfg.prefill_replicas + [
                dataclasses.replace(engine_cfg.decode, seed=engine_cfg.decode.seed + i)
                for i in range(engine_cfg.decode_replicas)
            ]
        else:
            configs = [
                dataclasses.replace(engine_cfg, seed=engine_cfg.seed + i) for i in range(replicas)
            ]
        self.workers: list[ActorHandle] = [
            cls.options(scheduling_strategy=s).remote(c, threads, engine)
            for c, s in zip(configs, where)
        ]
        # What a restarted replica needs: how to start one, and what every
        # replica has loaded (the last weights and adapter; ``_version`` counts loads).
        self._cls, self._configs, self._where = cls, configs, where
        self._threads, self._engine = threads, engine
        # (weights: an object-store reference, or under rollout.weight_sync=collective
        # the call that makes one of the trainer's current weights)
        self._weights: ray.ObjectRef | Callable[[], ray.ObjectRef] | None = None
        self._adapter: ray.ObjectRef | None = None
        self._version = 0
        # The policy version every replica serves (``load_weights``).
        self.policy_version = 0
        # Replica -> (its start-and-resync call, the load version it syncs to, start time).
        self._restarting: dict[int, tuple[ray.ObjectRef, int, float]] = {}
        self.restarts = [0] * len(self.workers)
        self.max_restarts = max_restarts
        self._left_out: set[int] = set()  # died with no restarts left
        self._starting = [w.ready.remote() for w in self.workers]
        if wait:
            self.wait_ready()
        if self.pd is not None:
            pools = PDRouter(self.pd.prefill_replicas, self.pd.decode_replicas, vnodes)
            first = self.pd.prefill_replicas
            self.pools = [Pool("prefill", 0, pools.prefill), Pool("decode", first, pools.decode)]
        else:
            self.pools = [Pool("replica", 0, Router(replicas, vnodes))]
        # The last pool's: where sessions stick and samples come from.
        self.router = self.pools[-1].router
        # The engines' counters at the previous stats(), and what the metrics need.
        self._stats = ReplicaStats(replicas, self.pd)

    def wait_ready(self) -> None:
        """Block until every replica has started its engine (``wait=False`` at
        construction lets the caller start other workers meanwhile); a replica that
        fails to start closes the group and raises its error."""
        if not self._starting:
            return
        try:
            ray.get(self._starting)
        except Exception:
            self.close()
            raise
        self._starting = []

    def _with_kv_dir(self, pd: PDEngineConfig) -> PDEngineConfig:
        """A file connector without a directory gets a fresh temporary one, removed on close."""
        spec = pd.prefill.kv_transfer
        assert spec is not None, "a PD prefill replica's config has its kv_transfer side"
        if spec.connector not in FILE_CONNECTORS or spec.shared_dir:
            return pd
        import tempfile

        self._own_kv_dir = tempfile.mkdtemp(prefix="rlpost-kv-")

        def side(c: VLLMEngineConfig) -> VLLMEngineConfig:
            assert c.kv_transfer is not None  # each pool's engine has its connector
            kv = dataclasses.replace(c.kv_transfer, shared_dir=self._own_kv_dir)
            return dataclasses.replace(c, kv_transfer=kv)

        return dataclasses.replace(pd, prefill=side(pd.prefill), decode=side(pd.decode))

    @property
    def prefill_workers(self) -> list[ActorHandle]:
        """PD mode: the KV producers (empty otherwise)."""
        return self.workers[: self.pools[-1].first]

    @property
    def decode_workers(self) -> list[ActorHandle]:
        """PD mode: the KV consumers, which return the samples; otherwise every worker."""
        return self.workers[self.pools[-1].first :]

    # -- generation --------------------------------------------------------

    def generate_async(self, requests: list[GenerationRequest]) -> PendingGeneration:
        """Send every request now; collect with ``.result()``."""
        return PendingGeneration(self, requests)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Generate and wait; results in input order."""
        return self.generate_async(requests).result()

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        """One request from asyncio code (the agent loop's turns): the same routing,
        session stickiness and failover as ``generate``, awaited instead of blocking."""
        hops = self._submit(request)
        try:
            await hops[-1][1]  # the result's ObjectRef
        except ray.exceptions.RayActorError:
            pass  # _collect marks the replica and sends the request again
        return self._collect(request, hops)

    def _submit(self, request: GenerationRequest) -> Hops:
        """Send ``request`` along its route; nothing here waits. PD mode: the
        prefill call, then a decode call that Ray starts once the prefill is done
        (it resolves the ``after`` argument first)."""
        *prefill, last = self._pick(lambda: route(self.pools, request.session_id))
        self._stats.saw_prompt(len(request.prompt_ids))
        for worker in (*prefill, last):
            self._begin(worker)
        hops = [(w, self.workers[w].generate_one.remote(prefill_request(request))) for w in prefill]
        if not hops:
            return [(last, self.workers[last].generate_one.remote(request))]
        ref = self.workers[last].generate_after.remote(request, hops[-1][1])
        self._in_flight.append(ref)  # for _drain
        if len(self._in_flight) > 4096:  # forget finished ones now and then
            _, self._in_flight = ray.wait(
                self._in_flight, num_returns=len(self._in_flight), timeout=0, fetch_local=False
            )
        return [*hops, (last, ref)]

    def _collect(self, request: GenerationRequest, hops: Hops) -> GenerationResult:
        """The last replica's result. A replica of the route found dead is marked
        (and restarted) and the whole request sent again: its sessions fall to
        the next replica on the ring meanwhile; once none is left, ``_pick``
        waits for the restart."""
        while True:
            try:
                for worker, ref in hops:
                    try:
                        result = ray.get(ref)
                    except ray.exceptions.RayActorError as exc:
                        self._on_failure(worker, exc)
                        break
                else:
                    return result
                retry = self._submit(request)
            finally:
                for worker, _ in hops:
                    self._end(worker)
            hops = retry

    # -- weights, health, stats --------------------------------------------

    def load_weights(
        self,
        weights: ray.ObjectRef | NamedTensors,
        version: int | None = None,
        interrupt: bool = False,
    ) -> float:
        """Load new weights into every replica; returns the wall seconds.

        ``weights``: an ObjectRef to a list of ``(hf_name, tensor)`` (e.g.
        ``TrainerGroup.weights_ref()``), or the list itself, which is put in
        the object store once. Each replica fetches the one stored copy, waits
        for its requests in flight to finish, loads, and resumes. ``version``:
        the policy version they are (the trainer's update count; default one
        more than the last), stamped on every token sampled with them.
        ``interrupt`` (partial rollout): requests in flight stop where they are
        and continue under the new weights instead of finishing first.
        """
        start = time.perf_counter()
        ref = weights if isinstance(weights, ray.ObjectRef) else ray.put(weights)
        self._drain()
        self._weights, self._version = ref, self._version + 1
        self.policy_version = self.policy_version + 1 if version is None else version
        self._call_live(
            RolloutWorker.load_weights, ref, self.policy_version, interrupt and self.pd is None
        )
        return time.perf_counter() - start

    def load_weights_collective(
        self,
        sync: CollectiveSync | IpcSync,
        trainer: TrainerGroup,
        version: int | None = None,
        interrupt: bool = False,
    ) -> dict[str, float]:
        """``load_weights`` without the object store: ``trainer`` (a ``TrainerGroup``)
        sends its weights in buckets over the weight group to every replica's workers
        (``rollout.weight_sync=collective``), or hands them to the one colocated
        replica as memory it maps (``ipc``). Returns the sync's figures."""
        self._drain()
        self._version += 1
        self.policy_version = self.policy_version + 1 if version is None else version
        return sync.sync(trainer, self.policy_version, interrupt and self.pd is None)

    def _drain(self) -> None:
        """PD mode: wait until every request sent so far has finished on both pools.

        A decode call waits in Ray for its prefill, so without this a weight load
        could land between the two halves of a request (KV from the old weights,
        samples from the new); and the KV files the loads clear must not be in use.
        """
        if self._in_flight:
            ray.wait(self._in_flight, num_returns=len(self._in_flight), fetch_local=False)
            self._in_flight = []

    def load_lora_adapter(
        self, adapter: ray.ObjectRef | Adapter, version: int | None = None, interrupt: bool = False
    ) -> float:
        """Serve later requests with this LoRA adapter (``rollout.lora_sync=adapter``).

        ``adapter``: an ObjectRef to ``(tensors, peft_config)`` as the trainer's
        ``adapter_weights()`` returns them; every replica fetches the one copy.
        ``version`` and ``interrupt``: as ``load_weights``.
        """
        start = time.perf_counter()
        ref = adapter if isinstance(adapter, ray.ObjectRef) else ray.put(adapter)
        self._drain()
        self._adapter, self._version = ref, self._version + 1
        self.policy_version = self.policy_version + 1 if version is None else version
        self._call_live(
            RolloutWorker.load_lora_adapter, ref, self.policy_version, interrupt and self.pd is None
        )
        return time.perf_counter() - start

    # -- restarts ------------------------------------------------------------

    def _is_current(self, worker: int, exc: ray.exceptions.RayActorError) -> bool:
        """Whether ``exc`` is the death of ``self.workers[worker]`` (not of an actor
        already replaced, nor of the producer of an argument, e.g. a trainer rank)."""
        return exc.actor_id is None or exc.actor_id == self.workers[worker]._actor_id.hex()

    def _on_failure(self, worker: int, exc: ray.exceptions.RayActorError) -> None:
        """A call to ``worker`` failed: if the current actor died, take it out of the
        router and restart it."""
        if worker not in self._restarting and self._is_current(worker, exc):
            self._restart(worker, exc)

    def _restart(self, worker: int, exc: BaseException) -> None:
        """Start a new actor for dead ``worker`` (same engine config and placement);
        it returns to the router once it has loaded the group's current weights."""
        router, index = router_of(self.pools, worker)
        router.mark_unhealthy(index)
        why = " ".join(str(exc).split())[:300]
        if self.restarts[worker] >= self.max_restarts:
            log.error(
                "rollout replica %d died after %d restarts; left out (%s)",
                worker,
                self.restarts[worker],
                why,
            )
            self._left_out.add(worker)
            return
        log.warning(
            "rollout replica %d died; its requests go to the others while it restarts (%s)",
            worker,
            why,
        )
        ray.kill(self.workers[worker])  # it may be hung rather than gone
        start = time.perf_counter()
        self.workers[worker] = self._cls.options(scheduling_strategy=self._where[worker]).remote(
            self._configs[worker], self._threads, self._engine
        )
        self.restarts[worker] += 1
        self._stats.forget(worker)
        self._resync(worker, start)

    def _resync(self, worker: int, start: float) -> None:
        # Under rollout.weight_sync=collective no copy is kept: a zero-argument call
        # gives the trainer's current weights through the object store.
        weights = self._weights() if callable(self._weights) else self._weights
        sync = self.workers[worker].resync.remote(weights, self._adapter, self.policy_version)
        self._restarting[worker] = (sync, self._version, start)

    def _poll_restarts(self, wait: bool = False) -> None:
        """Return replicas whose restart has finished to the router; ``wait``:
        block until at least one has."""
        if not self._restarting:
            return
        refs = [sync for sync, _, _ in self._restarting.values()]
        ready, _ = ray.wait(refs, num_returns=1 if wait else len(refs), timeout=None if wait else 0)
        for i, (sync, version, start) in list(self._restarting.items()):
            if sync not in ready:
                continue
            del self._restarting[i]
            try:
                ray.get(sync)
            except ray.exceptions.RayActorError as exc:
                if self._is_current(i, exc):  # died while starting: try again
                    self._restart(i, exc)
                    continue
                # What it loaded came from an actor that died (e.g. a trainer
                # rank): it catches up at the next load.
                self._restarting[i] = (self.workers[i].ready.remote(), -1, start)
                raise
            if version != self._version:  # weights were loaded meanwhile: those too
                self._resync(i, start)
                continue
            router, index = router_of(self.pools, i)
            router.mark_healthy(index)
            seconds = time.perf_counter() - start
            log.warning("rollout replica %d restarted and synced in %.1f s", i, seconds)

    def wait_restarts(self) -> None:
        """Block until every replica being restarted is back in the router."""
        while self._restarting:
            self._poll_restarts(wait=True)

    def _pick(self, pick: Callable[[], T]) -> T:
        """``pick()`` a replica, waiting for a restart when no replica is healthy."""
        self._poll_restarts()
        while True:
            try:
                return pick()
            except LookupError:
                if not self._restarting:
                    raise
                self._poll_restarts(wait=True)

    # The worker's method, typed by what its call answers; its arguments are not
    # checked against it (an object-store reference stands for its value).
    @overload
    def _call_live(
        self,
        method: Callable[Concatenate[RolloutWorker, ...], Coroutine[object, object, T]],
        *args: object,
    ) -> dict[int, T]: ...

    @overload
    def _call_live(
        self, method: Callable[Concatenate[RolloutWorker, ...], T], *args: object
    ) -> dict[int, T]: ...

    def _call_live(
        self,
        method: Callable[Concatenate[RolloutWorker, ...], Coroutine[object, object, T] | T],
        *args: object,
    ) -> dict[int, T]:
        """``method(*args)`` (a ``RolloutWorker`` method) on every replica not restarting,
        results by replica index. A replica found dead is restarted and left out (it
        catches up by itself)."""
        self._poll_restarts()
        calls = {
            i: getattr(w, method.__name__).remote(*args)
            for i, w in enumerate(self.workers)
            if i not in self._restarting and i not in self._left_out
        }
        out = {}
        for i, ref in calls.items():
            try:
                out[i] = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                if not self._is_current(i, exc):
                    raise  # e.g. the trainer rank that produced the weights died
                self._restart(i, exc)
        return out

    def _begin(self, worker: int) -> None:
        router, index = router_of(self.pools, worker)
        router.begin(index)

    def _end(self, worker: int) -> None:
        router, index = router_of(self.pools, worker)
        router.end(index)

    def stats(self) -> dict[str, float]:
        """``rollout/{role}{i}/requests`` and ``.../prefix_cache_hit_rate`` per
        replica (role ``replica``; PD mode ``prefill`` and ``decode``). The
        group's ``rollout/prefix_cache_hit_rate`` is the first pool's (where
        prompts are computed); PD mode's ``rollout/pd/kv_transfer_rate`` is the
        share of the decode side's uncached prompt tokens whose KV came from the
        connector. Rates are over the tokens since the previous call (so one
        call per step). ``requests`` is cumulative: every request begun on that
        replica since the group started (a restarted replica keeps its count, a
        request sent again after a replica died counts again), so a step's
        share is the difference between two calls.
        The first call in PD mode whose decode side computed prompt tokens and
        loaded none through the connector logs one warning with the reason."""
        engine_stats = self._call_live(RolloutWorker.stats)  # a replica restarting has none
        return self._stats.metrics(engine_stats, self.pools, self.restarts)

    def sleep(self, level: int) -> None:
        """Every replica frees its device memory (``rlpost.loop.memory``)."""
        self._call_live(RolloutWorker.sleep, level)

    def wake(self, tags: list[str]) -> None:
        self._call_live(RolloutWorker.wake, tags)

    def reset_prefix_cache(self) -> None:
        """Empty every replica's prefix cache (e.g. between benchmark runs)."""
        ray.get([w.reset_prefix_cache.remote() for w in self.workers])

    def served(self) -> list[list[tuple[str | None, str]]]:
        """Per replica, ``(session_id, prompt_hash)`` of each request it received
        (PD mode: prefill replicas first, then decode replicas)."""
        return ray.get([w.served.remote() for w in self.workers])

    def close(self) -> None:
        for w in self.workers:
            ray.kill(w)
        self.workers = []
        if self._own_kv_dir is not None:
            import shutil

            shutil.rmtree(self._own_kv_dir, ignore_errors=True)
            self._own_kv_dir = None


def _is_sglang_pd(engine_cfg: object) -> TypeGuard[SGLangPDConfig]:
    return type(engine_cfg).__name__ == "SGLangPDConfig"
