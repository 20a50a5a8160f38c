"""Placement groups over two Ray nodes on this machine.

A head (1 CPU, custom resource ``head``) and a second node (2 CPUs,
``worker_node``) form one cluster. The FSDP group's two ranks are placed one
per node (``trainer.placement=separate``, ``strict_spread``) and train over
gloo between the nodes; the driver is ``python -m rlpost.main`` started with
``RAY_ADDRESS`` naming the cluster, as on a cluster node. (A driver of its own,
not this test process: the pytest process has joined and left many Ray
sessions by then, and a driver should start as clean as a user's.)
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

pytest.importorskip("ray")
pytest.importorskip("vllm")

from ray_nodes import RayNode, ray_head, ray_worker_node  # noqa: E402

from rlpost.config.compose import compose

STEPS = 2

# Scores differ between almost any two sampled completions, so every group has
# a nonzero advantage and the update moves the weights.
REWARD_PY = """
def score(completion, row):
    return sum(map(ord, completion)) / (127 * max(len(completion), 1))
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[str, RayNode, RayNode]]:
    with ray_head(num_cpus=1, resources={"head": 1}) as (head, address):
        with ray_worker_node(address, num_cpus=2, resources={"worker_node": 1}) as worker:
            yield address, head, worker


@pytest.fixture
def joined(cluster, monkeypatch) -> Iterator[str]:
    """``RAY_ADDRESS`` names the cluster, as in a Ray job or on a cluster node."""
    address = cluster[0]
    monkeypatch.setenv("RAY_ADDRESS", address)
    yield address


def node_names(address: str) -> dict[str, str]:
    """Ray node id -> 'head' or 'worker_node' (the custom resource each node has)."""
    import ray

    ray.init(address=address)
    try:
        return {
            n["NodeID"]: "head" if "head" in n["Resources"] else "worker_node"
            for n in ray.nodes()
            if n["Alive"]
        }
    finally:
        ray.shutdown()


def test_pack_spills_onto_a_second_node_and_strict_pack_fails_fast(joined):
    """Three 1-CPU bundles fit no single node: pack spreads them, strict_pack says why it can't."""
    import ray

    from rlpost.device import DeviceSpec
    from rlpost.workers.placement import Placement, PlacementError

    names = node_names(joined)
    ray.init(address=joined)
    try:
        # policy: 2 ranks x 1 CPU, rollout: 1 CPU = 3 CPUs; nodes have 1 and 2.
        cfg = compose(["trainer.world_size=2", "trainer.placement=colocated"])
        placement = Placement(cfg, DeviceSpec("cpu", "gloo").ray_resource)
        try:
            nodes = [n for ids in placement.node_ids().values() for n in ids]
            assert sorted(names[n] for n in nodes) == ["head", "worker_node", "worker_node"]
        finally:
            placement.remove()
        strict = compose(
            ["trainer.world_size=2", "trainer.placement_strategy=strict_pack",
             "trainer.placement_timeout_s=3"]
        )  # fmt: skip
        with pytest.raises(PlacementError) as err:
            Placement(strict, {})
        assert "trainer.placement_strategy=strict_pack" in str(err.value)
        assert "alive nodes" in str(err.value)
        # The failed groups were removed: the whole cluster is free again.
        deadline = time.monotonic() + 10
        while ray.available_resources().get("CPU") != 3.0:
            assert time.monotonic() < deadline, ray.available_resources()
            time.sleep(0.2)
    finally:
        ray.shutdown()


def test_fsdp_group_spans_both_nodes_and_trains(joined, cluster, tmp_path: Path):
    from cli_utils import ENV, metrics

    from rlpost.models.tiny import build_tiny_model

    _, head, worker = cluster
    model = build_tiny_model("micro", tmp_path / "model", seed=0)
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD_PY)
    run_dir = tmp_path / "run"
    args = [
        "algo=grpo", f"model.path={model}", f"trainer.run_dir={run_dir}",
        f"trainer.total_steps={STEPS}", "trainer.val_every=1", "data.prompts_per_step=4",
        "rollout.n=2", "data.val_size=8", "rollout.kv_cache_gib=0.0625",
        "trainer.world_size=2", "trainer.placement=separate",
        "trainer.placement_strategy=strict_spread", "trainer.lr=1e-2",
        "trainer.lr_warmup_steps=0", "reward=custom", f"reward.fn={reward}:score",
        # the weights go to the replica over a weight group spanning the nodes
        "rollout.weight_sync=collective", "rollout.weight_sync_bucket_mb=0.1",
    ]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "rlpost.main", *args],
        capture_output=True, text=True, timeout=600, env={**ENV, "RAY_ADDRESS": joined},
    )  # fmt: skip
    if proc.returncode != 0:  # with Ray's own account of each actor it stopped
        gcs = head.grep_logs("ctor")
        raise AssertionError(f"exit {proc.returncode}:\n{proc.stderr[-3000:]}\nGCS:\n{gcs}")
    history = metrics(run_dir)

    # One rank per node: the placement says so, and each node's own logs hold
    # exactly one trainer-rank actor.
    placement = json.loads((run_dir / "placement.json").read_text())
    names = node_names(joined)
    ranks = placement["roles"]["policy"]["node_ids"]
    assert sorted(names[n] for n in ranks) == ["head", "worker_node"]
    assert len(head.actor_logs("TrainerWorker")) == 1
    assert len(worker.actor_logs("TrainerWorker")) == 1

    steps = [h for h in history if h["step"] > 0]
    assert len(steps) == STEPS
    assert all(math.isfinite(h["actor/loss"]) and h["actor/grad_norm"] > 0 for h in steps)
    assert all("val/reward_mean" in h for h in history)  # a custom reward: no accuracy
    # The replica sampled from the weights the two ranks trained (sync across nodes),
    # sent in buckets over the weight group, not through the object store.
    assert max(h["rollout/logprob_abs_diff_max"] for h in steps) < 1e-3
    assert all(h["rollout/weight_sync/buckets"] >= 3 for h in steps)
    # The update changed the policy that rank 0 gathered and saved.
    from transformers import AutoModelForCausalLM

    before = AutoModelForCausalLM.from_pretrained(model).state_dict()
    after = AutoModelForCausalLM.from_pretrained(run_dir / "final").state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
