"""Colocated memory (``rollout.sleep``, ``rlpost.loop.memory``): when it is on,
the order of sleep, wake and sync around an update, the sleep level, and the
combinations that cannot work. The rollout group here is a recording fake
(``RecordingRollout``): only the schedule above the engines is under test."""

from __future__ import annotations

import pytest

from rlpost.config.compose import compose
from rlpost.config.schema import ConfigError
from rlpost.loop.memory import ADAPTER_SLEEP_LEVEL, SLEEP_LEVEL, colocated_memory
from rlpost.plan.engines import sleeps
from rlpost.rollout.vllm.config import VLLMEngineConfig, engine_args


class RecordingRollout:
    """A FAKE rollout group that records the memory calls made on it."""

    def __init__(self):
        self.calls: list[tuple] = []

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake(self, tags):
        self.calls.append(("wake", tuple(tags)))


def test_auto_sleeps_only_colocated_on_an_accelerator_in_sync_mode():
    assert sleeps(compose([]), "cuda")
    assert sleeps(compose([]), "npu")
    assert not sleeps(compose([]), "cpu")
    assert not sleeps(compose(["trainer.placement=separate"]), "cuda")
    assert not sleeps(compose(["trainer.async_mode=one_step_off"]), "cuda")
    assert not sleeps(compose(["rollout.sleep=off"]), "cuda")
    assert sleeps(compose(["rollout.sleep=on", "trainer.device=cuda"]), "cuda")


def test_weights_wake_first_then_the_sync_then_the_kv_cache():
    rollout = RecordingRollout()
    memory = colocated_memory(compose([]), "cuda", rollout)
    assert memory is not None and memory.level == SLEEP_LEVEL == 2
    memory.before_training()
    rollout.calls.append(("update",))

    def sync():
        rollout.calls.append(("sync",))
        return 0.25

    metrics = memory.after_training(sync)
    assert rollout.calls == [
        ("sleep", 2), ("update",), ("wake", ("weights",)), ("sync",), ("wake", ("kv_cache",)),
    ]  # fmt: skip
    assert metrics["timing/weight_sync_s"] == 0.25 and metrics["timing/rollout_wake_s"] >= 0
    assert colocated_memory(compose([]), "cpu", rollout) is None


def test_an_adapter_sync_keeps_the_base_weights_in_host_memory():
    cfg = compose(["model.lora.rank=8", "rollout.lora_sync=adapter"])
    memory = colocated_memory(cfg, "cuda", RecordingRollout())
    assert memory is not None and memory.level == ADAPTER_SLEEP_LEVEL == 1


def test_the_engine_asks_vllm_for_its_sleep_mode_only_when_it_sleeps():
    cuda = {"model_path": "m", "kv_cache_gib": 1.0, "device": "cuda"}
    on = engine_args(VLLMEngineConfig(**cuda, sleep_mode=True), 0)
    off = engine_args(VLLMEngineConfig(**cuda), 0)
    assert on["enable_sleep_mode"] is True and "enable_sleep_mode" not in off


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["rollout.sleep=on", "trainer.device=cpu"], "vLLM's CPU build has no sleep mode"),
        (["rollout.sleep=on", "trainer.device=cuda", "trainer.async_mode=one_step_off"],
         "cannot sleep during the update"),
    ],
    ids=["cpu", "overlap"],
)  # fmt: skip
def test_sleeping_where_it_cannot_work_is_a_config_error(overrides, message):
    with pytest.raises(ConfigError) as err:
        compose(overrides)
    assert message in str(err.value)
