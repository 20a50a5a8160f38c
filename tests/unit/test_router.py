"""The rollout router: consistent hashing of sessions, least-in-flight
routing of independent requests, failover and return."""

from __future__ import annotations

import pytest

from rlpost.rollout.router import ConsistentHashRing, Router

SESSIONS = [f"session-{i}" for i in range(10_000)]


def _assign(ring: ConsistentHashRing) -> list[int]:
    return [ring.lookup(s) for s in SESSIONS]


@pytest.mark.parametrize("n", range(2, 9))
def test_adding_a_replica_moves_about_one_over_n_and_only_to_it(n):
    ring = ConsistentHashRing(range(n))
    before = _assign(ring)
    ring.add(n)
    after = _assign(ring)
    moved = [(a, b) for a, b in zip(before, after) if a != b]
    frac = len(moved) / len(SESSIONS)
    # Ideal: the new replica takes 1/(n+1) of the sessions, e.g. 1/3 for n=2.
    assert 0.5 / (n + 1) < frac < 1.5 / (n + 1)
    assert all(b == n for _, b in moved), "a session moved between two old replicas"


@pytest.mark.parametrize("n", range(2, 9))
def test_removing_a_replica_moves_only_its_sessions(n):
    ring = ConsistentHashRing(range(n))
    before = _assign(ring)
    ring.remove(n - 1)
    after = _assign(ring)
    moved = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
    frac = len(moved) / len(SESSIONS)
    assert 0.5 / n < frac < 1.5 / n
    assert all(before[i] == n - 1 for i in moved)
    assert n - 1 not in after


def test_ring_is_balanced_and_stable_across_instances():
    a, b = ConsistentHashRing(range(4)), ConsistentHashRing(range(4))
    assign = _assign(a)
    assert assign == _assign(b)  # no per-process salt: same ring everywhere
    shares = [assign.count(r) / len(SESSIONS) for r in range(4)]
    # 128 virtual nodes per replica keep each share near 1/4.
    assert all(0.15 < s < 0.35 for s in shares), shares


def test_least_in_flight_by_hand():
    router = Router(3)
    # Nothing in flight: ties go to the lowest index.
    assert router.pick() == 0
    router.begin(0)
    assert router.pick() == 1
    router.begin(1)
    router.begin(1)
    # in flight: [1, 2, 0] -> replica 2
    assert router.pick() == 2
    router.begin(2)
    # [1, 2, 1] -> 0 (tie with 2, lower index)
    assert router.pick() == 0
    router.end(1)
    router.end(1)
    # [1, 0, 1] -> 1
    assert router.pick() == 1
    assert router.requests == [1, 2, 1]
    assert router.in_flight == [1, 0, 1]
    with pytest.raises(RuntimeError):
        router.end(1)


def test_sessions_are_sticky_and_spread():
    router = Router(4)
    first = {s: router.pick(s) for s in SESSIONS[:200]}
    # Load on other replicas does not move a session.
    for _ in range(50):
        router.begin(first[SESSIONS[0]])
    assert all(router.pick(s) == r for s, r in first.items())
    assert set(first.values()) == {0, 1, 2, 3}


def test_failover_to_next_replica_and_return():
    router = Router(3)
    home = {s: router.pick(s) for s in SESSIONS[:3000]}
    router.mark_unhealthy(1)
    during = {s: router.pick(s) for s in home}
    # Sessions of the healthy replicas stay put; replica 1's move elsewhere.
    assert all(during[s] == r for s, r in home.items() if r != 1)
    assert all(during[s] != 1 for s in home)
    # Each displaced session goes to the next healthy owner clockwise, which
    # is what a ring without replica 1 would say.
    without = ConsistentHashRing([0, 2])
    assert all(during[s] == without.lookup(s) for s in home)
    # Independent requests avoid it as well, even when it is idle.
    router.begin(0)
    router.begin(2)
    assert router.pick() in (0, 2)
    router.mark_healthy(1)
    assert {s: router.pick(s) for s in home} == home
    assert router.pick() == 1


def test_all_unhealthy_is_an_error():
    router = Router(2)
    router.mark_unhealthy(0)
    router.mark_unhealthy(1)
    with pytest.raises(LookupError):
        router.pick()
    with pytest.raises(LookupError):
        router.pick("s")
