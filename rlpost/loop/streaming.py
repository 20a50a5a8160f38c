"""Fully asynchronous rollouts: prompt groups stream through a bounded buffer.

``GroupProducer`` keeps up to ``max_inflight`` prompt groups generating (each
group is one prompt's ``rollout.n`` samples, or its ``n`` agent episodes) and
hands them out in the order they finish, not the order they were sent. It
never blocks on its own: the controller's loop drives it (``fill``, ``wait``)
and is the only loop that decides when the run stops.

Staleness is counted in policy versions (updates applied). A group admitted at
version ``v`` samples its tokens at versions ``>= v``; the trainer at version
``u`` may train a sample whose oldest token is at least ``u - max_staleness``.
Admission follows AReaL's capacity rule: at version ``u`` at most
``(u + max_staleness + 1) * per_step`` groups may have been admitted (plus
those discarded, which free their place), so a group is not started only to be
thrown away: with every group finishing in the order it was admitted the bound
always holds. A group that finishes late anyway (a long tail, a stalled
episode) is dropped and counted by the caller (``discard``).

Rows are drawn from the prompt stream a batch at a time and admitted one by
one; each group remembers the batch it came from, whose number seeds it as
``sync`` seeds that batch's step, so ``max_staleness=0`` trains exactly the
samples ``sync`` trains.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from rlpost.rollout.base import GenerationResult


class Handle(Protocol):
    """A generation in flight (a ``PendingGeneration`` or ``PendingEpisodes``)."""

    def done(self) -> bool: ...
    def result(self) -> list[GenerationResult]: ...


@dataclass
class Group:
    index: int  # admission order, from 0
    batch: int  # the prompt-stream batch its row was drawn in, from 1 (the sync step)
    row: dict
    handle: Handle | None  # None: its results are in hand (a whole batch's group)
    version: int  # the policy version when it was admitted
    start: float
    end: float = 0.0
    results: list[GenerationResult] = field(default_factory=list)
    scores: dict[str, torch.Tensor] = field(default_factory=dict)  # its samples' scores, by name


class GroupProducer:
    """Admits prompt groups within the staleness bound and the in-flight limit and
    returns them as they finish. ``draw()`` gives the next batch of prompt rows;
    ``submit(row, batch)`` starts one group and returns its ``Handle``."""

    def __init__(
        self,
        draw: Callable[[], list[dict]],
        submit: Callable[[dict, int], Handle],
        per_step: int,
        max_inflight: int,
        max_staleness: int,
        first_batch: int = 1,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
        poll_s: float = 0.002,
    ):
        if per_step < 1 or max_inflight < 1 or max_staleness < 0:
            raise ValueError(
                f"per_step={per_step}, max_inflight={max_inflight}, max_staleness="
                f"{max_staleness}: need per_step >= 1, max_inflight >= 1, max_staleness >= 0"
            )
        self.draw, self.submit = draw, submit
        self.per_step, self.max_inflight, self.max_staleness = per_step, max_inflight, max_staleness
        self.clock, self.sleep, self.poll_s = clock, sleep, poll_s
        self.first_version = first_batch - 1  # the version the run (re)starts at
        self.admitted = 0  # groups started since (re)start
        self.discarded = 0  # finished groups that will not be trained (stale, filtered)
        self.inflight: list[Group] = []
        self.ready: deque[Group] = deque()  # finished, in completion order
        self._rows: deque[tuple[int, dict]] = deque()
        self._next_batch = first_batch
        self.closed = False
        self.trimmed = 0  # groups cancelled by a lower limit (their rows go out again)

    # -- admission -----------------------------------------------------------------
    def capacity(self, version: int) -> int:
        """Groups that may still be admitted at ``version`` under the staleness bound."""
        steps = version - self.first_version + self.max_staleness + 1
        return steps * self.per_step + self.discarded - self.admitted

    def fill(self, version: int) -> int:
        """Admit groups while the bound and the in-flight limit allow; returns how many."""
        started = 0
        while (
            not self.closed
            and len(self.inflight) < self.max_inflight
            and self.capacity(version) > 0
        ):
            if not self._rows:
                self._rows.extend((self._next_batch, row) for row in self.draw())
                self._next_batch += 1
            batch, row = self._rows.popleft()
            handle = self.submit(row, batch)
            group = Group(self.admitted, batch, row, handle, version, self.clock())
            self.inflight.append(group)
            self.admitted += 1
            started += 1
        return started

    def set_limit(self, limit: int) -> int:
        """A new in-flight limit (``async.max_inflight=auto``). Above it, the youngest
        groups in flight are cancelled (they have sampled least) and their rows are
        admitted again first; a handle without ``cancel`` runs on. Returns how many
        were cancelled."""
        if limit < 1:
            raise ValueError(f"in-flight limit {limit}: need at least 1")
        self.max_inflight = limit
        cancelled: list[Group] = []
        for g in reversed(self.inflight):
            if len(self.inflight) - len(cancelled) <= limit:
                break
            cancel = getattr(g.handle, "cancel", None)
            if cancel is not None:
                cancel()
                cancelled.append(g)
        for g in cancelled:  # youngest first: pushed to the front, they come back in order
            self.inflight.remove(g)
            self._rows.appendleft((g.batch, g.row))
        self.admitted -= len(cancelled)
        self.trimmed += len(cancelled)
        return len(cancelled)

    # -- completion ----------------------------------------------------------------
    def poll(self) -> int:
        """Move the groups that have finished to ``ready``; returns how many."""
        finished = [g for g in self.inflight if g.handle is None or g.handle.done()]
        for g in finished:
            self.inflight.remove(g)
            g.end = self.clock()
            self.ready.append(g)
        return len(finished)

    def wait(self, version: int) -> list[Group]:
        """Every finished group, waiting for at least one (admitting more meanwhile).
        Raises ``RuntimeError`` when nothing is in flight or ready and nothing may
        be admitted (the caller must discard or train what it took first)."""
        while True:
            self.fill(version)
            self.poll()
            if self.ready:
                out = list(self.ready)
                self.ready.clear()
                return out
            if not self.inflight:
                raise RuntimeError(
                    f"nothing to wait for at version {version}: {self.admitted} admitted, "
                    f"{self.discarded} discarded, capacity {self.capacity(version)}"
                )
            self.sleep(self.poll_s)

    def discard(self, group: Group) -> None:
        """A finished group that will not be trained: its place is free again."""
        self.discarded += 1

    def requeue(self, groups: list[Group]) -> None:
        """Finished groups taken but not used now (more than a batch): first next time."""
        self.ready.extendleft(reversed(groups))

    # -- the end -------------------------------------------------------------------
    def close(self) -> int:
        """Stop admitting; cancel what is in flight (handles with ``cancel``) and
        forget what is buffered. Returns how many admitted groups were left untrained
        (rows drawn but not yet admitted are not counted)."""
        self.closed = True
        left = len(self.inflight) + len(self.ready)
        for g in self.inflight:
            cancel = getattr(g.handle, "cancel", None)
            if cancel is not None:
                cancel()
        self.inflight.clear()
        self.ready.clear()
        self._rows.clear()
        return left

    def staleness(self, group: Group, version: int, versions: list[int]) -> int:
        """Updates between the oldest token of ``versions`` (or the admission version,
        when no token says) and ``version``."""
        known = [v for v in versions if v >= 0]
        return version - (min(known) if known else group.version)
