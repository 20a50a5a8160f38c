"""Which rollout replica serves a request.

Independent requests go to the replica with the fewest requests in flight.
Requests that carry a session id go by consistent hashing of that id, so every
turn of a multi-turn session reaches the replica whose prefix cache already
holds the conversation. The ring has virtual nodes: adding or removing one of
N replicas moves about 1/N of the sessions, and a replica marked unhealthy is
skipped (its sessions fall to the next replica clockwise) until it is marked
healthy again, when exactly those sessions come back.

Plain Python; the Ray side lives in ``rlpost/serving/rollout_group.py``.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Iterable


def _hash64(key: str) -> int:
    """A stable 64-bit hash (Python's ``hash`` of a str changes per process)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class ConsistentHashRing:
    """A hash ring of replica indices, each placed at ``vnodes`` points.

    ``lookup(key, usable)`` walks clockwise from the key's point to the first
    point owned by a replica for which ``usable(replica)`` holds. More virtual
    nodes spread each replica's share more evenly (the share's relative
    spread shrinks like 1/sqrt(vnodes)).
    """

    def __init__(self, replicas: Iterable[int] = (), vnodes: int = 128):
        if vnodes < 1:
            raise ValueError(f"vnodes must be >= 1, got {vnodes}")
        self.vnodes = vnodes
        self._points: list[int] = []  # sorted hash points
        self._owners: list[int] = []  # replica owning each point
        self._replicas: set[int] = set()
        for r in replicas:
            self.add(r)

    @property
    def replicas(self) -> frozenset[int]:
        return frozenset(self._replicas)

    def add(self, replica: int) -> None:
        if replica in self._replicas:
            raise ValueError(f"replica {replica} is already on the ring")
        self._replicas.add(replica)
        for v in range(self.vnodes):
            point = _hash64(f"replica-{replica}#{v}")
            i = bisect.bisect(self._points, point)
            self._points.insert(i, point)
            self._owners.insert(i, replica)

    def remove(self, replica: int) -> None:
        if replica not in self._replicas:
            raise ValueError(f"replica {replica} is not on the ring")
        self._replicas.discard(replica)
        keep = [(p, o) for p, o in zip(self._points, self._owners) if o != replica]
        self._points = [p for p, _ in keep]
        self._owners = [o for _, o in keep]

    def lookup(self, key: str, usable: Callable[[int], bool] = lambda _: True) -> int:
        """The first usable replica clockwise from ``key``'s point."""
        if not self._points:
            raise LookupError("the ring has no replicas")
        start = bisect.bisect(self._points, _hash64(key))
        n = len(self._points)
        seen: set[int] = set()
        for k in range(n):
            owner = self._owners[(start + k) % n]
            if owner in seen:
                continue
            if usable(owner):
                return owner
            seen.add(owner)
            if len(seen) == len(self._replicas):
                break
        raise LookupError("no usable replica on the ring")


class Router:
    """Routes requests over ``replicas`` replicas (indices ``0 .. replicas-1``).

    The caller brackets each request with ``begin(i)`` / ``end(i)`` so the
    router knows what is in flight; ``pick`` does not change any count.
    """

    def __init__(self, replicas: int, vnodes: int = 128):
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        self.ring = ConsistentHashRing(range(replicas), vnodes)
        self.in_flight = [0] * replicas
        self.requests = [0] * replicas  # requests begun on each replica, ever
        self.healthy = [True] * replicas

    @property
    def num_replicas(self) -> int:
        return len(self.in_flight)

    def pick(self, session_id: str | None = None) -> int:
        """Replica for one request: by the ring for a session, else least in flight.

        Ties between equally loaded replicas go to the lowest index, so a
        burst of independent requests is spread round-robin.
        """
        if session_id is not None:
            return self.ring.lookup(session_id, usable=lambda r: self.healthy[r])
        candidates = [r for r in range(self.num_replicas) if self.healthy[r]]
        if not candidates:
            raise LookupError("every replica is marked unhealthy")
        return min(candidates, key=lambda r: (self.in_flight[r], r))

    def begin(self, replica: int) -> None:
        self.in_flight[replica] += 1
        self.requests[replica] += 1

    def end(self, replica: int) -> None:
        if self.in_flight[replica] <= 0:
            raise RuntimeError(f"end({replica}) without a matching begin")
        self.in_flight[replica] -= 1

    def mark_unhealthy(self, replica: int) -> None:
        self.healthy[replica] = False

    def mark_healthy(self, replica: int) -> None:
        self.healthy[replica] = True
