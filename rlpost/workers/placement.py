"""Joining Ray and placing the worker groups on its nodes.

Every worker (one trainer rank, one rollout replica) gets one bundle of a Ray
placement group, sized by its CPU (and GPU or NPU) request. The bundles are
reserved before any worker starts, so a run that does not fit the cluster
fails with a message instead of starting half its workers and hanging.

``trainer.placement``:

- ``colocated``: one placement group for every role (policy ranks first, then
  reference, teacher, critic, rollout), so the strategy packs them together;
- ``separate``: one placement group per role, each placed on its own.

``trainer.placement_strategy`` is Ray's: ``pack`` puts a group's bundles on as
few nodes as possible and spreads them over more nodes when one node is not
enough; ``spread`` spreads them as evenly as it can; the ``strict_`` variants
fail instead of falling back (``strict_spread``: one bundle per node).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from rlpost.config.groups import Config
from rlpost.config.schema import ConfigError
from rlpost.workers import WORKER_ENV
from rlpost.workers.ray_types import RayOptions

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

log = logging.getLogger(__name__)


def cpu_threads(cfg: Config, device_kind: str, role: str = "trainer") -> int:
    """Torch threads per trainer rank (``role="trainer"``) or rollout replica
    (``"rollout"``), from ``trainer.threads``.

    ``auto`` on the CPU: the trainer ranks share every core this process may
    use, in every mode. A replica gets an equal share of them in ``sync`` mode,
    where generation and the update take turns; in ``one_step_off`` and
    ``fully_async``, where both compute at once, it keeps its
    ``rollout.num_cpus``, and the cores are oversubscribed while both run. On
    a CPU the update is the longer side (the replica is idle ~90 % of an
    overlapping step), and a trainer held to the cores the replica does not
    use was the slower choice: 4.76 s a step against 3.13 s with all cores and
    3.38 s in sync mode (bench/README.md, "threads when overlapping"). On an
    accelerator the host threads do little: one.
    """
    t, r = cfg.trainer, cfg.rollout
    if t.threads != "auto":
        return int(t.threads)
    if device_kind != "cpu":
        return 1
    cores = len(os.sched_getaffinity(0))
    overlap = t.async_mode in ("one_step_off", "fully_async")
    if role == "rollout":
        return max(1, int(r.num_cpus) if overlap else cores // r.replicas)
    return max(1, cores // t.world_size)


def set_wait_policy(cfg: Config, device_kind: str) -> None:
    """OpenMP's wait policy in the workers started after this call.

    When generation and the update overlap on the CPU (one_step_off,
    fully_async) the trainer's and the replicas' threads outnumber the cores,
    and a thread that spins at a barrier burns the core a thread of the other
    process needs: there the workers get ``OMP_WAIT_POLICY=PASSIVE`` (a thread
    with nothing to do sleeps). On the long-tail workload of
    bench/async_bench.py, fully_async went from 87.9 to 116.5 samples/s with it.
    In sync mode one process computes at a time and waking sleeping threads at
    every small operator costs more than it saves (79 against 115 samples/s), so
    there the OpenMP default stays. A policy set in the driver's environment wins.
    """
    overlap = cfg.trainer.async_mode in ("one_step_off", "fully_async")
    if overlap and device_kind == "cpu" and "OMP_WAIT_POLICY" not in os.environ:
        WORKER_ENV["OMP_WAIT_POLICY"] = "PASSIVE"
    else:
        WORKER_ENV.pop("OMP_WAIT_POLICY", None)


class PlacementError(ConfigError):
    """The cluster cannot hold the placement groups the config asks for."""


def start(cfg: Config, device_opts: RayOptions) -> tuple[bool, Placement]:
    """Connect to Ray (``connect``) and reserve the run's placement groups.

    Returns whether this call made the Ray connection (the caller then
    disconnects at the end) and the placement. On failure it disconnects
    what it connected.
    """

    started = connect(cfg)
    try:
        return started, Placement(cfg, device_opts)
    except BaseException:
        if started:
            disconnect()
        raise


def connect(cfg: Config) -> bool:
    """Connect this process to Ray; returns whether it made the connection.

    - ``RAY_ADDRESS`` set (a Ray job's entrypoint always has it): join that
      cluster; ``RAY_ADDRESS=auto`` joins the one ``ray start`` runs here.
    - Ray already initialised by the caller (a notebook's own ``ray.init``):
      use it as it is.
    - Otherwise start a private local Ray sized for the run.

    The caller disconnects (``ray.shutdown``) only when this returns True: on a
    cluster that only disconnects this driver, on a private Ray it stops it.
    """
    import ray

    if ray.is_initialized():
        return False
    address = os.environ.get("RAY_ADDRESS")
    if address:
        run_dir = cfg.trainer.run_dir or "outputs/<time>-<algo>"
        if not Path(run_dir).is_absolute():
            log.warning(
                "trainer.run_dir=%s is relative to %s; a Ray job runs in a temporary copy of "
                "its working directory: pass an absolute path (on a shared filesystem when "
                "trainer ranks run on other nodes)",
                run_dir,
                os.getcwd(),
            )
        ray.init(address=address, log_to_driver=True)
        return True
    cpus = sum(b.get("CPU", 0.0) for role in bundles(cfg, {}).values() for b in role)
    # A SIGTERM to the whole process group (what `timeout`, batch schedulers and
    # container runtimes send) must reach only this driver, which then checkpoints
    # and stops cleanly: Ray's processes (GCS, raylet and the workers the raylet
    # starts) are started with SIGTERM blocked, and keep it blocked for life.
    # ``disconnect`` stops them with SIGKILL.
    # Token authentication guards the private Ray from other users of this machine;
    # the note that it is on is nothing to act on.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(
        logging.ERROR
    )
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        ray.init(
            # "local" starts a new Ray even when `ray start` runs on this machine.
            address="local",
            num_cpus=max(os.cpu_count() or 1, int(cpus + 0.999)),
            include_dashboard=False,
            log_to_driver=True,
            logging_level=logging.WARNING,
            # Ray starts idle workers for a new driver's tasks by default; every
            # worker here is an actor with a runtime_env of its own, which never
            # takes one, so they would only take CPU while the run starts.
            _system_config={"prestart_worker_first_driver": False},
        )
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return True


def disconnect() -> None:
    """``ray.shutdown()`` after ``connect`` returned True. A private Ray's processes
    ignore SIGTERM (``connect``), so its usual stop -- SIGTERM, a second's grace
    for each process, then SIGKILL -- would wait out every grace: they get SIGKILL
    at once (nothing of a private Ray outlives the run)."""
    import ray
    from ray._private import worker as ray_worker

    node = getattr(ray_worker, "_global_node", None)
    ray_pids: list[int] = []
    if node is not None and hasattr(node, "kill_all_processes"):
        started = [i.process.pid for infos in node.all_processes.values() for i in infos]
        ray_pids = [*started, *(d for pid in started for d in _descendants(pid))]
        kill = node.kill_all_processes

        def kill_at_once(
            check_alive: bool = False, allow_graceful: bool = False, wait: bool = False
        ) -> None:
            kill(check_alive=check_alive, allow_graceful=False, wait=wait)

        node.kill_all_processes = kill_at_once
    ray.shutdown()
    # The raylet's workers and agents would notice its death and exit by themselves,
    # some while later: end them now, so that nothing of the run outlives it.
    for pid in ray_pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(_running(pid) for pid in ray_pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (Linux ``/proc``; none elsewhere)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        out.append(child)
        todo += children.get(child, [])
    return out


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def bundles(cfg: Config, device_opts: RayOptions) -> dict[str, list[dict[str, float]]]:
    """The resource bundles of each role, one per worker.

    ``device_opts`` is what a worker passes to ``ray.remote`` besides its CPUs
    (``DeviceSpec.ray_resource``: ``{"num_gpus": 1}``, ``{"resources": {"NPU": 1}}``
    or ``{}``).
    """
    device: dict[str, float] = {}
    if "num_gpus" in device_opts:
        device["GPU"] = float(device_opts["num_gpus"])
    for name, amount in device_opts.get("resources", {}).items():
        device[name] = float(amount)
    t = cfg.trainer
    rank = {"CPU": t.num_cpus_per_worker, **device}
    out: dict[str, list[dict[str, float]]] = {"policy": [dict(rank) for _ in range(t.world_size)]}
    if cfg.algo.needs_reference:
        out["reference"] = [dict(rank) for _ in range(t.world_size)]
    if cfg.algo.needs_teacher:  # algo=opd: a frozen group, placed like the reference
        out["teacher"] = [dict(rank) for _ in range(t.world_size)]
    if cfg.algo.needs_critic:
        out["critic"] = [dict(rank) for _ in range(t.world_size)]
    out["rollout"] = [{"CPU": cfg.rollout.num_cpus, **device} for _ in range(cfg.rollout.replicas)]
    if cfg.reward.model.path is not None:
        out["reward_model"] = [{"CPU": cfg.reward.model.num_cpus, **device}]
    if cfg.reward.judge.path is not None:
        out["judge"] = [{"CPU": cfg.reward.judge.num_cpus, **device}]
    return out


def _alive_nodes() -> list[dict[str, float]]:
    """Each alive Ray node's total resources (without the ``node:<ip>`` markers)."""
    import ray

    return [
        {k: float(v) for k, v in n["Resources"].items() if not k.startswith("node:")}
        for n in ray.nodes()
        if n["Alive"]
    ]


@dataclass
class _Slot:
    group: PlacementGroup
    offset: int  # index of the role's first bundle in its group
    count: int


class RolePlacement(TypedDict):
    bundles: list[dict[str, float]]
    node_ids: list[str]


class PlacementInfo(TypedDict):
    """``Placement.describe()``, as ``placement.json`` holds it."""

    mode: str
    strategy: str
    roles: dict[str, RolePlacement]
    nodes: dict[str, str | None]  # node id -> its address


class Placement:
    """The placement groups of one run and which bundles belong to which role."""

    def __init__(self, cfg: Config, device_opts: RayOptions):
        from ray.util import placement_group

        t = cfg.trainer
        self.mode = t.placement
        self.strategy = t.placement_strategy.upper()
        self.requested = bundles(cfg, device_opts)
        self._check_fits(cfg)
        self.slots: dict[str, _Slot] = {}
        self.groups: list[PlacementGroup] = []
        if self.mode == "colocated":
            flat = [b for role in self.requested.values() for b in role]
            pg = placement_group(flat, strategy=self.strategy, name="rlpost-colocated")
            self.groups.append(pg)
            offset = 0
            for role, role_bundles in self.requested.items():
                self.slots[role] = _Slot(pg, offset, len(role_bundles))
                offset += len(role_bundles)
        else:
            for role, role_bundles in self.requested.items():
                pg = placement_group(role_bundles, strategy=self.strategy, name=f"rlpost-{role}")
                self.groups.append(pg)
                self.slots[role] = _Slot(pg, 0, len(role_bundles))
        self._wait(t.placement_timeout_s)

    def _check_fits(self, cfg: Config) -> None:
        """Fail at once when the bundles can never fit the cluster's nodes (Ray would
        keep the groups pending until the timeout), with what was asked and what
        the cluster has, and only the changes that would help."""
        from rlpost.workers.placement_fit import asked_for, remedies, unfit

        nodes = _alive_nodes()
        reasons = unfit(self.requested, self.mode, self.strategy.lower(), nodes)
        if not reasons:
            return
        raise PlacementError(
            [
                f"trainer.placement={self.mode}, trainer.placement_strategy="
                f"{self.strategy.lower()}: the cluster cannot hold the bundles this run asks "
                f"for: {asked_for(self.requested)}",
                self._cluster_line(nodes),
                *reasons,
                *remedies(cfg, self.requested, nodes),
            ]
        )

    def _cluster_line(self, nodes: list[dict[str, float]]) -> str:
        """``the cluster: 1 alive node; total CPU 2; available now CPU 2`` (only the
        resources the bundles name, and CPU and GPU)."""
        import ray

        from rlpost.workers.placement_fit import resources_text

        names = {"CPU", "GPU"} | {k for bs in self.requested.values() for b in bs for k in b}

        def only(r: dict[str, float]) -> dict[str, float]:
            return {k: float(r.get(k, 0.0)) for k in sorted(names) if k in r or k == "CPU"}

        return (
            f"the cluster (ray.cluster_resources): {len(nodes)} alive node"
            f"{'s' if len(nodes) != 1 else ''}; total {resources_text(only(ray.cluster_resources()))}; "
            f"available now {resources_text(only(ray.available_resources()))}"
        )

    def _wait(self, timeout_s: float) -> None:
        import ray

        from rlpost.workers.placement_fit import asked_for

        ready = ray.wait([pg.ready() for pg in self.groups], num_returns=len(self.groups),
                         timeout=timeout_s)[0]  # fmt: skip
        if len(ready) == len(self.groups):
            return
        self.remove()
        # The bundles fit the cluster's totals (``_check_fits``): what they need is held.
        raise PlacementError(
            [
                f"trainer.placement={self.mode}, trainer.placement_strategy="
                f"{self.strategy.lower()}: the cluster has room for these bundles but did "
                f"not free it within trainer.placement_timeout_s={timeout_s:g}: "
                f"{asked_for(self.requested)}",
                self._cluster_line(_alive_nodes()),
                "other jobs or actors hold the rest: wait for them or stop them, raise "
                "trainer.placement_timeout_s, or lower trainer.num_cpus_per_worker or "
                "rollout.num_cpus",
            ]
        )

    def has(self, role: str) -> bool:
        return role in self.slots

    def scheduling(self, role: str) -> list[PlacementGroupSchedulingStrategy]:
        """One scheduling strategy per worker of ``role``, in rank order."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        slot = self.slots[role]
        return [
            PlacementGroupSchedulingStrategy(
                placement_group=slot.group, placement_group_bundle_index=slot.offset + i
            )
            for i in range(slot.count)
        ]

    def node_ids(self) -> dict[str, list[str]]:
        """The Ray node id of each bundle, per role, in rank order."""
        from ray.util import placement_group_table

        out = {}
        for role, slot in self.slots.items():
            table = placement_group_table(slot.group)["bundles_to_node_id"]
            out[role] = [table[slot.offset + i] for i in range(slot.count)]
        return out

    def describe(self) -> PlacementInfo:
        """Mode, strategy, bundles and nodes of every role (written to ``placement.json``)."""
        import ray

        ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        node_ids = self.node_ids()
        return {
            "mode": self.mode,
            "strategy": self.strategy,
            "roles": {
                role: {"bundles": self.requested[role], "node_ids": node_ids[role]}
                for role in self.slots
            },
            "nodes": {nid: ips.get(nid) for ids in node_ids.values() for nid in ids},
        }

    def save(self, run_dir: Path) -> None:
        info = self.describe()
        (run_dir / "placement.json").write_text(json.dumps(info, indent=1) + "\n")
        log.info(
            "placement (%s, %s): %s",
            info["mode"],
            info["strategy"],
            "; ".join(
                f"{role} on {', '.join(info['nodes'][n] or n[:8] for n in r['node_ids'])}"
                for role, r in info["roles"].items()
            ),
        )

    def remove(self) -> None:
        from ray.util import remove_placement_group

        for pg in self.groups:
            remove_placement_group(pg)
        self.groups = []
