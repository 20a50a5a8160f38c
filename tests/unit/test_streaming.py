"""The fully_async producer's logic (``rlpost.loop.streaming``), without Ray or an
engine: a fake generator with scripted latencies on a fake clock (both named as
fakes) stands in for the replicas. The bound holds under every interleaving the
test drives, nothing is lost or trained twice, and the stop is clean."""

from __future__ import annotations

import itertools
import random

import pytest

from rlpost.loop.streaming import GroupProducer


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeHandle:
    """A group that finishes ``latency`` fake seconds after it was submitted; its
    tokens are stamped with the version the fake replica had when it finished
    (as partial rollout would stamp the last of them), or when it started."""

    def __init__(self, clock: FakeClock, latency: float, version_now, partial: bool):
        self.clock, self.end = clock, clock.now + latency
        self.version_now, self.partial = version_now, partial
        self.start_version = version_now()
        self.cancelled = False

    def done(self) -> bool:
        return self.clock.now >= self.end

    def result(self) -> list[dict]:
        last = self.version_now() if self.partial else self.start_version
        return [{"versions": [self.start_version, last]}]

    def cancel(self) -> None:
        self.cancelled = True


def drive(max_staleness: int, latencies, per_step=4, max_inflight=8, steps=12, partial=False):
    """Run a trainer loop over the producer; returns what it trained, per step,
    and the producer."""
    clock = FakeClock()
    rows = itertools.count()
    version = [0]
    submitted: list[FakeHandle] = []

    def submit(row, batch):
        handle = FakeHandle(clock, next(latencies), lambda: version[0], partial)
        handle.row, handle.batch = row, batch
        submitted.append(handle)
        return handle

    producer = GroupProducer(
        lambda: [{"id": next(rows)} for _ in range(per_step)], submit, per_step,
        max_inflight=max_inflight, max_staleness=max_staleness,
        clock=clock, sleep=clock.sleep, poll_s=0.01,
    )  # fmt: skip
    trained: list[list[tuple[int, int]]] = []  # per step: (row id, staleness)
    dropped = 0
    for _step in range(steps):
        batch = []
        while len(batch) < per_step:
            for i, g in enumerate(finished := producer.wait(version[0])):
                if len(batch) == per_step:
                    producer.requeue(finished[i:])
                    break
                versions = g.handle.result()[0]["versions"]
                lag = producer.staleness(g, version[0], versions)
                if lag > max_staleness:
                    producer.discard(g)
                    dropped += 1
                    continue
                batch.append((g.row["id"], lag))
            # the bound on admissions, at every point the loop reaches
            assert producer.admitted <= (version[0] + max_staleness + 1) * per_step + (
                producer.discarded
            )
            assert len(producer.inflight) <= max_inflight
        trained.append(batch)
        clock.sleep(0.3)  # the update
        version[0] += 1
        producer.fill(version[0])
    left = producer.close()
    return trained, producer, submitted, dropped, left


@pytest.mark.parametrize("max_staleness", [0, 1, 2, 4])
@pytest.mark.parametrize("seed", range(5))
def test_the_bound_holds_and_nothing_is_lost_or_trained_twice(max_staleness, seed):
    rng = random.Random(seed)
    # heavy-tailed latencies: most groups 0.1-0.5 s, one in eight 2-4 s
    latencies = iter(
        lambda: rng.uniform(2, 4) if rng.random() < 0.125 else rng.uniform(0.1, 0.5), None
    )
    trained, producer, submitted, dropped, left = drive(max_staleness, latencies)
    ids = [row for batch in trained for row, _ in batch]
    assert len(ids) == len(set(ids)) == 12 * 4  # every step full, no group twice
    assert all(lag <= max_staleness for batch in trained for _, lag in batch)
    # every admitted group is accounted for: trained, dropped as stale, or left at the end
    assert producer.admitted == len(submitted) == len(ids) + dropped + left
    finished_untrained = left - sum(h.cancelled for h in submitted)
    assert finished_untrained >= 0  # in flight at the end: cancelled; buffered: forgotten
    # the stop cancels what was in flight and admits nothing more
    assert producer.inflight == [] and not producer.ready
    assert producer.fill(100) == 0


def test_staleness_zero_trains_each_batch_at_its_own_version_in_admission_order():
    """``max_staleness=0`` is sync: batch k is admitted whole at version k-1 and
    trained at version k-1, whatever order its groups finish in."""
    rng = random.Random(0)
    latencies = iter(lambda: rng.uniform(0.1, 3.0), None)
    trained, producer, submitted, dropped, _ = drive(0, latencies, per_step=4, steps=6)
    assert dropped == 0
    for step, batch in enumerate(trained):
        assert sorted(row for row, _ in batch) == list(range(4 * step, 4 * step + 4))
        assert all(lag == 0 for _, lag in batch)
    assert [h.batch for h in submitted[:24]] == [1 + i // 4 for i in range(24)]


def test_one_slow_group_is_dropped_and_its_place_refilled():
    """A group that finishes after the bound has passed is dropped (counted by the
    caller), its place is free again, and later steps stay full."""
    # group 0 takes 10 s; everything else 0.1 s
    latencies = itertools.chain([10.0], itertools.repeat(0.1))
    trained, producer, _, dropped, _ = drive(1, latencies, per_step=2, max_inflight=4, steps=30,
                                             partial=False)  # fmt: skip
    assert dropped == 1 and producer.discarded == 1
    assert 0 not in [row for batch in trained for row, _ in batch]
    assert all(len(batch) == 2 for batch in trained)


def test_with_partial_rollout_the_newest_tokens_do_not_excuse_the_oldest():
    """Staleness is the oldest token's: a group that spans versions is judged by
    where it started, not by the version that finished it."""
    latencies = itertools.chain([5.0], itertools.repeat(0.1))
    _, _, _, dropped, _ = drive(1, latencies, per_step=2, max_inflight=4, steps=20, partial=True)
    assert dropped == 1


def test_capacity_rule_in_numbers():
    """(version + max_staleness + 1) x per_step groups, plus those discarded, minus
    those admitted: at version 0 with max_staleness 2 and 4 per step, 12."""
    handles = []
    producer = GroupProducer(
        lambda: [{}] * 4, lambda row, batch: handles.append(batch) or object(), 4,
        max_inflight=100, max_staleness=2,
    )  # fmt: skip
    assert producer.capacity(0) == 12
    assert producer.fill(0) == 12 and handles == [1] * 4 + [2] * 4 + [3] * 4
    assert producer.fill(0) == 0
    assert producer.fill(1) == 4  # one update: one more batch
    producer.discard(object())
    assert producer.capacity(1) == 1
    with pytest.raises(ValueError, match="max_inflight"):
        GroupProducer(lambda: [], lambda r, b: None, 4, max_inflight=0, max_staleness=1)


@pytest.mark.parametrize("max_staleness", [0, 1, 2, 4])
def test_groups_that_finish_in_admission_order_are_never_dropped(max_staleness):
    """The capacity rule admits no group that would be too old by the time the
    trainer reaches it, as long as groups finish in the order they started."""
    trained, _, _, dropped, _ = drive(max_staleness, itertools.repeat(0.25), steps=20)
    assert dropped == 0
    lags = [lag for batch in trained for _, lag in batch]
    assert max(lags) <= max_staleness and (max_staleness == 0 or max(lags) > 0)
