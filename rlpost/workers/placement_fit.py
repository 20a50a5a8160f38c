"""Whether the run's placement groups can ever fit the cluster, and what to change
when they cannot.

Ray keeps a placement group that does not fit pending, so without this check a
run asking for more than the cluster has waits out
``trainer.placement_timeout_s``. Here the bundles are compared with the alive
nodes' total resources (``ray.nodes()``, as ``ray.cluster_resources()`` sums
them) before any group is made: a total beyond the cluster's, a bundle larger
than every node, a ``strict_pack`` group larger than every node or a
``strict_spread`` group with more bundles than nodes fails at once. What fits the
totals but not what is free now (other jobs hold it) still waits for the timeout.
Plain Python, testable without Ray.
"""

from __future__ import annotations

import math

from rlpost.config.groups import Config

Bundle = dict[str, float]
Requested = dict[str, list[Bundle]]  # role -> one bundle per worker


def _fmt(x: float) -> str:
    return f"{x:g}"


def resources_text(r: dict[str, float]) -> str:
    """`CPU 2, GPU 1`: resource amounts in one line."""
    return ", ".join(f"{k} {_fmt(v)}" for k, v in sorted(r.items())) or "nothing"


def _fits(bundle: Bundle, node: dict[str, float]) -> bool:
    return all(node.get(k, 0.0) >= v - 1e-9 for k, v in bundle.items())


def _sum(bundles: list[Bundle]) -> dict[str, float]:
    out: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            out[k] = out.get(k, 0.0) + v
    return out


def asked_for(requested: Requested) -> str:
    """``policy 1 x {CPU 1}, ...; total CPU 3``: the bundles per role and their sum."""
    roles = [
        f"{role} {len(bs)} x {{{resources_text(bs[0])}}}" for role, bs in requested.items() if bs
    ]
    return f"{', '.join(roles)}; total {resources_text(_sum([b for bs in requested.values() for b in bs]))}"


def unfit(
    requested: Requested, mode: str, strategy: str, nodes: list[dict[str, float]]
) -> list[str]:
    """Why the bundles can never be placed on ``nodes`` (each node's total
    resources), one line per reason; empty when they can. ``mode``: colocated (one
    group of every role's bundles) or separate (one group per role); ``strategy``:
    Ray's, lower case."""
    flat = [b for bs in requested.values() for b in bs]
    groups = [flat] if mode == "colocated" else [bs for bs in requested.values() if bs]
    need, have = _sum(flat), _sum(nodes)
    reasons = [
        f"{k}: the bundles ask for {_fmt(v)}, the cluster has {_fmt(have.get(k, 0.0))}"
        for k, v in sorted(need.items())
        if v > have.get(k, 0.0) + 1e-9
    ]
    for role, bs in requested.items():
        if bs and not any(_fits(bs[0], n) for n in nodes):
            largest = max(nodes, key=lambda n: n.get("CPU", 0.0), default={})
            reasons.append(
                f"a {role} bundle ({resources_text(bs[0])}) fits no node (the largest has "
                f"{resources_text({k: largest.get(k, 0.0) for k in bs[0]})})"
            )
    if reasons:
        return reasons
    for group in groups:
        if strategy == "strict_pack" and not any(_fits(_sum(group), n) for n in nodes):
            reasons.append(
                f"trainer.placement_strategy=strict_pack puts a group of {len(group)} "
                f"bundles ({resources_text(_sum(group))}) on one node, and no node has that"
            )
        holders = sum(any(_fits(b, n) for b in group) for n in nodes)
        if strategy == "strict_spread" and len(group) > holders:
            reasons.append(
                f"trainer.placement_strategy=strict_spread puts each of {len(group)} bundles "
                f"on its own node, and {holders} of the {len(nodes)} nodes can hold one"
            )
    return reasons


def remedies(cfg: Config, requested: Requested, nodes: list[dict[str, float]]) -> list[str]:
    """What would make the bundles fit ``nodes``: only changes that help."""
    t, r = cfg.trainer, cfg.rollout
    need, have = _sum([b for bs in requested.values() for b in bs]), _sum(nodes)
    out = []
    if need.get("CPU", 0.0) > have.get("CPU", 0.0):
        trainer_bundles = sum(len(bs) for role, bs in requested.items() if role != "rollout")
        rollout_bundles = len(requested.get("rollout", []))
        # Scale both CPU requests by the same factor, down to a tenth of a CPU.
        scale = have.get("CPU", 0.0) / need["CPU"]
        tr = math.floor(t.num_cpus_per_worker * scale * 10) / 10
        ro = math.floor(r.num_cpus * scale * 10) / 10
        if tr > 0 and ro > 0 and tr * trainer_bundles + ro * rollout_bundles <= have["CPU"]:
            out.append(
                f"fit the cluster's {_fmt(have['CPU'])} CPUs with fewer Ray CPUs per worker: "
                f"trainer.num_cpus_per_worker={_fmt(tr)} rollout.num_cpus={_fmt(ro)} "
                f"(now {_fmt(t.num_cpus_per_worker)} x {trainer_bundles} trainer bundles, "
                f"{_fmt(r.num_cpus)} x {rollout_bundles} rollout bundles)"
            )
        more = need["CPU"] - have.get("CPU", 0.0)
        out.append(f"or add nodes with {_fmt(math.ceil(more))} more CPUs")
    short = [k for k in need if k != "CPU" and need[k] > have.get(k, 0.0) + 1e-9]
    if short:
        fewer = ["trainer.world_size"] if t.world_size > 1 else []
        if r.pd.enabled:
            fewer.append("rollout.pd.prefill_replicas / decode_replicas")
        elif r.replicas > 1:
            fewer.append("rollout.replicas")
        what = f"lower {' or '.join(fewer)}, or " if fewer else ""
        out.append(f"{what}add nodes with {', '.join(short)} (each worker takes one)")
    largest_cpu = max((n.get("CPU", 0.0) for n in nodes), default=0.0)
    big = [
        key
        for key, value, roles in (
            (
                "trainer.num_cpus_per_worker",
                t.num_cpus_per_worker,
                ("policy", "reference", "teacher", "critic"),
            ),
            ("rollout.num_cpus", r.num_cpus, ("rollout",)),
        )
        if value > largest_cpu and any(requested.get(role) for role in roles)
    ]
    if big:
        out.append(f"set {' and '.join(big)} <= {_fmt(largest_cpu)} (the largest node's CPUs)")
    if not out and t.placement_strategy.startswith("strict_"):
        # The totals and every bundle fit: only the strict strategy does not.
        out.append(
            f"use trainer.placement_strategy=pack (now {t.placement_strategy}), which puts "
            "a group on as few nodes as it can and spills onto more when one is not enough"
        )
    return out
