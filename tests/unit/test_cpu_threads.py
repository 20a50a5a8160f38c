"""``trainer.threads=auto``: how many torch threads each process gets."""

import os

import pytest

from rlpost.config.compose import compose
from rlpost.config.schema import ConfigError
from rlpost.workers.placement import cpu_threads


@pytest.fixture
def eight_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))


@pytest.mark.parametrize(
    "overrides, trainer, rollout",
    [
        # sync: the computing role has every core; its processes share them
        ([], 8, 8),
        (["trainer.world_size=2"], 4, 8),
        (["trainer.world_size=4"], 2, 8),
        (["rollout.replicas=2"], 8, 4),
        # overlapping modes: each replica keeps rollout.num_cpus, the ranks still
        # share every core (oversubscribed while both compute)
        (["trainer.async_mode=one_step_off"], 8, 1),
        (["trainer.async_mode=one_step_off", "rollout.num_cpus=3"], 8, 3),
        (["trainer.async_mode=one_step_off", "rollout.replicas=2", "trainer.world_size=2"], 4, 1),
        (["trainer.async_mode=fully_async", "rollout.replicas=2"], 8, 1),
        # a number is taken as it is
        (["trainer.threads=3"], 3, 3),
    ],
)
def test_auto_threads_on_the_cpu(eight_cores, overrides, trainer, rollout):
    cfg = compose(["algo=grpo", *overrides])
    assert cpu_threads(cfg, "cpu") == trainer
    assert cpu_threads(cfg, "cpu", "rollout") == rollout


def test_auto_threads_never_drop_below_one(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    cfg = compose(["algo=grpo", "trainer.world_size=4"])
    assert cpu_threads(cfg, "cpu") == 1
    cfg = compose(["algo=grpo", "rollout.replicas=4", "rollout.num_cpus=0.5"])
    assert cpu_threads(cfg, "cpu", "rollout") == 1


def test_auto_threads_on_an_accelerator_are_one(eight_cores):
    assert cpu_threads(compose(["algo=grpo"]), "cuda") == 1
    assert cpu_threads(compose(["algo=grpo"]), "npu", "rollout") == 1


def test_threads_take_a_positive_number_or_auto():
    with pytest.raises(ConfigError, match="trainer.threads=0: must be >= 1"):
        compose(["algo=grpo", "trainer.threads=0"])
    with pytest.raises(ConfigError, match="trainer.threads='many'"):
        compose(["algo=grpo", "trainer.threads=many"])


def test_overlapping_modes_on_the_cpu_let_idle_openmp_threads_sleep(monkeypatch):
    from rlpost.workers import WORKER_ENV
    from rlpost.workers.placement import set_wait_policy

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setitem(WORKER_ENV, "OMP_WAIT_POLICY", "stale")
    set_wait_policy(compose(["trainer.async_mode=fully_async"]), "cpu")
    assert WORKER_ENV["OMP_WAIT_POLICY"] == "PASSIVE"
    set_wait_policy(compose([]), "cpu")  # sync: OpenMP's default
    assert "OMP_WAIT_POLICY" not in WORKER_ENV
    set_wait_policy(compose(["trainer.async_mode=one_step_off"]), "cuda")
    assert "OMP_WAIT_POLICY" not in WORKER_ENV
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the user's own choice wins
    set_wait_policy(compose(["trainer.async_mode=one_step_off"]), "cpu")
    assert "OMP_WAIT_POLICY" not in WORKER_ENV
