"""A placement that can never fit the cluster is refused at once, with what it
asked for against what the nodes have, and only the changes that would help
(``rlpost/workers/placement_fit.py``; plain Python, no Ray)."""

from __future__ import annotations

from rlpost.config.compose import compose
from rlpost.workers.placement import bundles
from rlpost.workers.placement_fit import asked_for, remedies, unfit


def test_more_cpus_than_the_cluster_has_names_the_totals_and_what_fits():
    # algo=ppo: policy, reference and critic 1 rank each + 1 rollout replica,
    # 1 CPU each = 4 CPUs; the cluster is one 2-CPU node.
    cfg = compose(["algo=ppo"])
    requested = bundles(cfg, {})
    nodes = [{"CPU": 2.0, "memory": 1e9}]
    assert asked_for(requested) == (
        "policy 1 x {CPU 1}, reference 1 x {CPU 1}, critic 1 x {CPU 1}, rollout 1 x {CPU 1}; "
        "total CPU 4"
    )
    assert unfit(requested, "colocated", "pack", nodes) == [
        "CPU: the bundles ask for 4, the cluster has 2"
    ]
    # scale = 2 / 4 = 0.5: 0.5 x 3 trainer bundles + 0.5 x 1 rollout = 2 CPUs.
    fixes = remedies(cfg, requested, nodes)
    assert fixes[0].startswith(
        "fit the cluster's 2 CPUs with fewer Ray CPUs per worker: "
        "trainer.num_cpus_per_worker=0.5 rollout.num_cpus=0.5"
    )
    assert fixes[1:] == ["or add nodes with 2 more CPUs"]
    assert not any("placement_strategy" in f for f in fixes)  # pack is already set
    # The same run fits a 4-CPU node (or 2 + 2 under pack).
    assert unfit(requested, "colocated", "pack", [{"CPU": 4.0}]) == []
    assert unfit(requested, "separate", "pack", [{"CPU": 2.0}, {"CPU": 2.0}]) == []


def test_only_a_strict_strategy_that_cannot_fit_suggests_pack():
    # 2 policy ranks + 1 replica = 3 one-CPU bundles; nodes of 1 and 2 CPUs hold
    # them in all (3 <= 3) but not on one node.
    cfg = compose(["trainer.world_size=2", "trainer.placement_strategy=strict_pack"])
    requested = bundles(cfg, {})
    nodes = [{"CPU": 1.0}, {"CPU": 2.0}]
    (reason,) = unfit(requested, "colocated", "strict_pack", nodes)
    assert reason.startswith("trainer.placement_strategy=strict_pack puts a group of 3 bundles")
    (fix,) = remedies(cfg, requested, nodes)
    assert fix.startswith("use trainer.placement_strategy=pack (now strict_pack)")
    assert unfit(requested, "colocated", "pack", nodes) == []
    # strict_spread: 3 bundles, 2 nodes.
    spread = compose(["trainer.world_size=2", "trainer.placement_strategy=strict_spread"])
    (reason,) = unfit(bundles(spread, {}), "colocated", "strict_spread", nodes)
    assert "each of 3 bundles on its own node, and 2 of the 2 nodes" in reason


def test_gpus_and_oversized_bundles_name_their_own_keys():
    # trainer.world_size=2 + 1 replica, one GPU each = 3 GPUs on a 2-GPU node.
    cfg = compose(["trainer.world_size=2", "trainer.num_cpus_per_worker=1"])
    requested = bundles(cfg, {"num_gpus": 1})
    nodes = [{"CPU": 16.0, "GPU": 2.0}]
    assert unfit(requested, "colocated", "pack", nodes) == [
        "GPU: the bundles ask for 3, the cluster has 2"
    ]
    assert remedies(cfg, requested, nodes) == [
        "lower trainer.world_size, or add nodes with GPU (each worker takes one)"
    ]
    # 4 + 1 CPUs fit two 3-CPU nodes in all, but no node holds a 4-CPU rank.
    big = compose(["trainer.num_cpus_per_worker=4"])
    nodes = [{"CPU": 3.0}, {"CPU": 3.0}]
    assert unfit(bundles(big, {}), "colocated", "pack", nodes) == [
        "a policy bundle (CPU 4) fits no node (the largest has CPU 3)"
    ]
    assert remedies(big, bundles(big, {}), nodes) == [
        "set trainer.num_cpus_per_worker <= 3 (the largest node's CPUs)"
    ]
