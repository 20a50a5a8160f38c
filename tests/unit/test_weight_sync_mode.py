"""``rollout.weight_sync``: what ``auto`` means where, and the combinations that
cannot work, refused before Ray starts with the key to change."""

from __future__ import annotations

import pytest

from rlpost.config.compose import compose
from rlpost.config.schema import ConfigError
from rlpost.serving.weight_group import weight_sync_mode


def test_auto_is_collective_on_cuda_with_vllm_and_the_object_store_elsewhere():
    assert weight_sync_mode("auto", "vllm", "cuda") == "collective"
    assert weight_sync_mode("auto", "vllm", "cpu") == "object_store"
    assert weight_sync_mode("auto", "sglang", "cuda") == "object_store"
    assert weight_sync_mode("auto", "vllm", "npu") == "object_store"
    assert weight_sync_mode("collective", "vllm", "cpu") == "collective"
    assert weight_sync_mode("object_store", "vllm", "cuda") == "object_store"


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["rollout=hf", "rollout.weight_sync=collective"],
         "rollout.weight_sync=collective: rollout.name=hf loads weights only through the "
         "object store; use rollout.weight_sync=object_store (or auto)"),
        (["rollout=hf", "rollout.weight_sync=ipc"],
         "rollout.weight_sync=ipc: rollout.name=hf loads weights only through the object store"),
        (["rollout.weight_sync=ipc", "rollout.replicas=2"],
         "rollout.weight_sync=ipc hands weights to one colocated replica, not with "
         "rollout.replicas=2: use rollout.weight_sync=collective"),
        (["rollout.weight_sync=ipc", "rollout=vllm_pd"],
         "rollout.weight_sync=ipc hands weights to one colocated replica, not with "
         "rollout.pd.enabled=true"),
        (["rollout.weight_sync=ipc", "trainer.placement=separate"],
         "rollout.weight_sync=ipc: trainer.placement=separate may put the replica on another "
         "node than trainer rank 0"),
        (["rollout.weight_sync=nccl"], "rollout.weight_sync"),
        (["rollout.weight_sync_bucket_mb=0"], "rollout.weight_sync_bucket_mb"),
    ],
    ids=["hf", "ipc_hf", "ipc_replicas", "ipc_pd", "ipc_separate", "unknown", "bucket"],
)  # fmt: skip
def test_combinations_that_cannot_work_are_config_errors(overrides, message):
    with pytest.raises(ConfigError) as err:
        compose(overrides)
    assert message in str(err.value)


def test_ascend_may_ask_for_the_collective_path():
    # its weight group is HCCL (rlpost.runtime.device.weight_group_backend)
    cfg = compose(["trainer.device=npu", "rollout.weight_sync=collective"])
    assert cfg.rollout.weight_sync == "collective"
