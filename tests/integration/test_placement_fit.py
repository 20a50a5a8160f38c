"""On a Ray smaller than the run, the placement fails in seconds with the figures,
not after ``trainer.placement_timeout_s`` (300 s) with advice already followed."""

from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray")

from rlpost.config.compose import compose  # noqa: E402
from rlpost.workers.placement import PlacementError, start  # noqa: E402


def test_a_placement_larger_than_the_cluster_fails_at_once_with_the_figures():
    # algo=ppo asks for 4 one-CPU bundles (policy, reference, critic, rollout);
    # this Ray has 2 CPUs, as a 2-CPU cluster a job joins would.
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        cfg = compose(["algo=ppo"])
        assert cfg.trainer.placement_timeout_s == 300
        begin = time.monotonic()
        with pytest.raises(PlacementError) as err:
            start(cfg, {})  # joins the Ray this process has, as a notebook's
        seconds = time.monotonic() - begin
        message = str(err.value)
        assert seconds < 10, seconds
        assert "total CPU 4" in message  # asked
        assert "1 alive node; total CPU 2; available now CPU 2" in message  # has
        assert "CPU: the bundles ask for 4, the cluster has 2" in message
        assert "trainer.num_cpus_per_worker=0.5 rollout.num_cpus=0.5" in message
        assert "use trainer.placement_strategy=pack" not in message  # already pack
        assert ray.util.placement_group_table() == {}  # no group was made
        assert ray.is_initialized()  # the caller's Ray is left as it was
    finally:
        ray.shutdown()
