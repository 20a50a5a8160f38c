"""The Ascend path's device-specific steps, run on the CPU against a Ray cluster
with ``{"NPU": 3}`` and a FAKE npu device (tests/integration/fake_npu.py): the
placement asks for NPU bundles, Ray gives each worker its own
``ASCEND_RT_VISIBLE_DEVICES``, device selection finds the npu, and the trainer
ranks' process group comes up with ``cpu:gloo,npu:hccl`` (hccl's name backed by
gloo in the fake). Tensor math on the npu is not tested: the fake cannot do it."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlpost.config import compose

ray = pytest.importorskip("ray")
HERE = Path(__file__).resolve().parent


class Rank:
    """One trainer rank's device set-up, as a TrainerWorker does it."""

    def setup(self, rank: int, world_size: int, init_method: str) -> dict:
        import os

        import fake_npu
        import torch
        import torch.distributed as dist

        fake_npu.install()
        from rlpost.device import resolve_device
        from rlpost.runtime import device as devices
        from rlpost.trainers.distributed import init_distributed

        spec = resolve_device("auto")  # auto finds the npu, as it would find CUDA
        device = init_distributed(spec.kind, spec.backend, rank, world_size, init_method)
        value = torch.tensor([float(rank + 1)])
        dist.all_reduce(value)  # a CPU tensor: the gloo half of the backend map
        out = {
            "kind": spec.kind,
            "backend": dist.get_backend(),
            "device": str(device),
            "visible": devices.visible_devices(spec.kind),
            "env": os.environ.get("ASCEND_RT_VISIBLE_DEVICES"),
            "current": str(devices.current_device(spec.kind)),
            "sum": value.item(),
            "hccl_groups": fake_npu.CREATED["hccl_groups"],
            "pin_memory": devices.pin_memory(),
        }
        dist.destroy_process_group()
        return out


@pytest.fixture
def npu_cluster():
    ray.init(address="local", num_cpus=4, resources={"NPU": 3}, include_dashboard=False)
    try:
        yield
    finally:
        ray.shutdown()


def test_placement_visible_devices_and_process_group_on_a_fake_npu(npu_cluster):
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from rlpost.device import DeviceSpec
    from rlpost.runtime import device as devices
    from rlpost.workers.placement import Placement, PlacementError, bundles

    spec = DeviceSpec("npu", devices.kind("npu").backend)
    assert spec.ray_resource == {"resources": {"NPU": 1}}
    assert spec.backend == "cpu:gloo,npu:hccl"
    cfg = compose(["trainer.device=npu", "trainer.world_size=2"])
    asked = bundles(cfg, spec.ray_resource)
    assert asked["policy"] == [{"CPU": 1.0, "NPU": 1.0}] * 2
    assert asked["rollout"] == [{"CPU": 1.0, "NPU": 1.0}]
    # Four ranks and a replica want five NPUs; the cluster has three: said at once.
    with pytest.raises(PlacementError) as err:
        Placement(compose(["trainer.device=npu", "trainer.world_size=4"]), spec.ray_resource)
    assert "NPU" in str(err.value)
    placement = Placement(cfg, spec.ray_resource)
    try:
        assert ray.available_resources().get("NPU", 0.0) == 0.0  # all three reserved
        slot = placement.slots["policy"]
        env = {"env_vars": {"PYTHONPATH": str(HERE)}}
        ranks = [
            ray.remote(num_cpus=1, runtime_env=env, **spec.ray_resource)(Rank)
            .options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    slot.group, placement_group_bundle_index=slot.offset + i
                )
            )
            .remote()
            for i in range(2)
        ]
        port = 29000 + __import__("os").getpid() % 1000
        out = ray.get(
            [r.setup.remote(i, 2, f"tcp://127.0.0.1:{port}") for i, r in enumerate(ranks)]
        )
    finally:
        placement.remove()
    assert [o["kind"] for o in out] == ["npu", "npu"]
    assert all(o["backend"] == "cpu:gloo,npu:hccl" for o in out)
    assert all(o["hccl_groups"] == 1 for o in out)  # the npu half of the group was made
    assert [o["sum"] for o in out] == [3.0, 3.0]
    # Ray lists one NPU per rank, a different one each; the rank binds to it.
    assert len({o["env"] for o in out}) == 2 and all(o["env"] in "012" for o in out)
    assert all(o["visible"] == [o["env"]] for o in out)
    assert all(o["device"] == "npu" and o["current"] == "npu:0" for o in out)
    assert all(o["pin_memory"] for o in out)
