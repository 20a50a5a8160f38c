"""A rollout group's replica pools and a request's route through them: PD mode
has a prefill pool and a decode pool, otherwise there is one pool; a request
visits one replica of each, in order, chosen by that pool's router."""

from __future__ import annotations

import dataclasses

from rlpost.rollout.router import Router


@dataclasses.dataclass(frozen=True)
class Pool:
    """Replicas ``workers[first : first + router.num_replicas]`` of one role.

    A request visits one replica of every pool of its group, in order: PD mode
    has a prefill pool and a decode pool, otherwise there is one pool. The last
    pool's replica returns the samples; ``role`` names the per-replica metrics."""

    role: str
    first: int
    router: Router

    def __contains__(self, worker: int) -> bool:
        return self.first <= worker < self.first + self.router.num_replicas


def route(pools: list[Pool], session_id: str | None) -> list[int]:
    """The worker index of each replica a request visits, one per pool."""
    return [pool.first + pool.router.pick(session_id) for pool in pools]


def router_of(pools: list[Pool], worker: int) -> tuple[Router, int]:
    """The router that routes to worker ``worker``, and its index there."""
    pool = next(p for p in pools if worker in p)
    return pool.router, worker - pool.first
