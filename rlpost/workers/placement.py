"""Joining Ray and placing the worker groups on its nodes.

Every worker (one trainer rank, one rollout replica) gets one bundle of a Ray
placement group, sized by its CPU (and GPU or NPU) request. The bundles are
reserved before any worker starts, so a run that does not fit the cluster
fails with a message instead of starting half its workers and hanging.

``trainer.placement``:

- ``colocated``: one placement group for every role (policy ranks first, then
  reference, critic, rollout), so the strategy packs them together;
- ``separate``: one placement group per role, each placed on its own.

``trainer.placement_strategy`` is Ray's: ``pack`` puts a group's bundles on as
few nodes as possible and spreads them over more nodes when one node is not
enough; ``spread`` spreads them as evenly as it can; the ``strict_`` variants
fail instead of falling back (``strict_spread``: one bundle per node).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlpost.config.groups import Config
from rlpost.config.schema import ConfigError

log = logging.getLogger(__name__)


def cpu_threads(cfg: Config, device_kind: str, role: str = "trainer") -> int:
    """Torch threads per trainer rank (``role="trainer"``) or rollout replica
    (``"rollout"``), from ``trainer.threads``.

    ``auto`` on the CPU: in ``sync`` mode generation and the update take turns,
    so the processes of the role that is computing share every core this
    process may use; in ``one_step_off`` mode both compute at once: each
    replica keeps its ``rollout.num_cpus`` and the trainer ranks share the
    rest. On an accelerator the host threads do little: one.
    """
    t, r = cfg.trainer, cfg.rollout
    if t.threads != "auto":
        return int(t.threads)
    if device_kind != "cpu":
        return 1
    cores = len(os.sched_getaffinity(0))
    overlap = t.async_mode == "one_step_off"
    if role == "rollout":
        return max(1, int(r.num_cpus) if overlap else cores // r.replicas)
    if overlap:
        cores -= int(r.replicas * r.num_cpus)
    return max(1, cores // t.world_size)


class PlacementError(ConfigError):
    """The cluster cannot hold the placement groups the config asks for."""


def start(cfg: Config, device_opts: dict[str, Any]) -> tuple[bool, Placement]:
    """Connect to Ray (``connect``) and reserve the run's placement groups.

    Returns whether this call made the Ray connection (the caller then
    disconnects at the end) and the placement. On failure it disconnects
    what it connected.
    """
    import ray

    started = connect(cfg)
    try:
        return started, Placement(cfg, device_opts)
    except BaseException:
        if started:
            ray.shutdown()
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
    ray.init(
        # "local" starts a new Ray even when `ray start` runs on this machine.
        address="local",
        num_cpus=max(os.cpu_count() or 1, int(cpus + 0.999)),
        include_dashboard=False,
        log_to_driver=True,
        logging_level=logging.WARNING,
    )
    return True


def bundles(cfg: Config, device_opts: dict[str, Any]) -> dict[str, list[dict[str, float]]]:
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
    if cfg.algo.needs_critic:
        out["critic"] = [dict(rank) for _ in range(t.world_size)]
    out["rollout"] = [{"CPU": cfg.rollout.num_cpus, **device} for _ in range(cfg.rollout.replicas)]
    return out


@dataclass
class _Slot:
    group: Any  # ray.util.placement_group.PlacementGroup
    offset: int  # index of the role's first bundle in its group
    count: int


class Placement:
    """The placement groups of one run and which bundles belong to which role."""

    def __init__(self, cfg: Config, device_opts: dict[str, Any]):
        from ray.util import placement_group

        t = cfg.trainer
        self.mode = t.placement
        self.strategy = t.placement_strategy.upper()
        self.requested = bundles(cfg, device_opts)
        self.slots: dict[str, _Slot] = {}
        self.groups: list[Any] = []
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

    def _wait(self, timeout_s: float) -> None:
        import ray

        ready = ray.wait([pg.ready() for pg in self.groups], num_returns=len(self.groups),
                         timeout=timeout_s)[0]  # fmt: skip
        if len(ready) == len(self.groups):
            return
        self.remove()
        nodes = [
            {k: v for k, v in n["Resources"].items() if not k.startswith("node:")}
            for n in ray.nodes()
            if n["Alive"]
        ]
        raise PlacementError(
            [
                f"trainer.placement={self.mode}, trainer.placement_strategy="
                f"{self.strategy.lower()}: the cluster did not fit these bundles within "
                f"trainer.placement_timeout_s={timeout_s:g}: {self.requested}",
                f"alive nodes: {nodes}",
                "lower trainer.world_size, trainer.num_cpus_per_worker or rollout.num_cpus, "
                "add nodes, or use trainer.placement_strategy=pack (strict_spread needs a node "
                "per bundle, strict_pack one node for all of a group)",
            ]
        )

    def has(self, role: str) -> bool:
        return role in self.slots

    def scheduling(self, role: str) -> list[Any]:
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

    def describe(self) -> dict[str, Any]:
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
