"""``async.max_inflight=auto``: the limit's steering by hand, and the producer
cancelling its youngest groups when the limit falls (a fake handle and clock from
test_streaming, named as fakes there, stand in for the replicas)."""

from __future__ import annotations

import itertools

from test_streaming import FakeClock, FakeHandle

from rlpost.loop.concurrency import InflightLimit
from rlpost.loop.streaming import GroupProducer


def test_the_limit_grows_while_the_trainer_waits_and_trims_on_pressure():
    # 16 groups a step, staleness 2: starts at 2 x 16 = 32, ceiling 3 x 16 = 48,
    # grows by 16 // 4 = 4
    lim = InflightLimit(per_step=16, max_staleness=2)
    assert (lim.limit, lim.ceiling, lim.step_up) == (32, 48, 4)
    assert lim.steer(wait_share=0.30, kv_peak=0.50, preempted=0, stale=0) == 36
    assert lim.steer(0.30, 0.95, 0, 0) == 36  # no KV room: hold
    assert lim.steer(0.02, 0.50, 0, 0) == 36  # the trainer hardly waited: hold
    for _ in range(5):
        lim.steer(0.30, 0.50, 0, 0)
    assert lim.limit == 48  # 36 + 4 x 3 = 48, then the ceiling
    assert lim.steer(0.30, 0.50, preempted=2, stale=0) == 36  # int(48 x 0.75)
    assert lim.steer(0.30, 0.50, 0, stale=1) == 27  # int(36 x 0.75)
    for _ in range(20):
        lim.steer(0.0, 1.0, 1, 0)
    assert lim.limit == 1  # never below one group
    # staleness 0: the bound admits one step's groups at most, and starts there
    assert InflightLimit(per_step=4, max_staleness=0).limit == 4


def test_a_lower_limit_cancels_the_youngest_groups_and_sends_their_rows_again():
    clock = FakeClock()
    handles: list[FakeHandle] = []
    rows = itertools.count()

    def submit(row, batch):
        h = FakeHandle(clock, 10.0, lambda: 0, False)
        h.row = row
        handles.append(h)
        return h

    p = GroupProducer(lambda: [next(rows) for _ in range(4)], submit, per_step=4,
                      max_inflight=8, max_staleness=1, clock=clock, sleep=clock.sleep)  # fmt: skip
    assert p.fill(0) == 8  # rows 0..7
    assert p.set_limit(5) == 3
    assert [h.cancelled for h in handles] == [False] * 5 + [True] * 3  # 5, 6, 7: the youngest
    assert [g.row for g in p.inflight] == [0, 1, 2, 3, 4]
    assert (p.admitted, p.trimmed) == (5, 3)
    assert p.fill(0) == 0  # at the limit
    assert p.set_limit(8) == 0
    assert p.fill(0) == 3
    assert [g.row for g in p.inflight] == [0, 1, 2, 3, 4, 5, 6, 7]  # the same rows, in order
    assert [g.batch for g in p.inflight] == [1, 1, 1, 1, 2, 2, 2, 2]  # and the same seeds
    assert p.admitted == 8 and p.capacity(0) == 0  # the bound counts them once
