"""``async.max_inflight=auto``: the limit's steering by hand (its growth undone when
it slowed the steps), and the producer
cancelling its youngest groups when the limit falls (a fake handle and clock from
test_streaming, named as fakes there, stand in for the replicas)."""

from __future__ import annotations

import itertools

from test_streaming import FakeClock, FakeHandle

from rlpost.loop.concurrency import InflightLimit
from rlpost.loop.streaming import GroupProducer


def test_the_limit_grows_while_the_trainer_waits_and_trims_on_pressure():
    # 16 groups a step, staleness 2: starts at 2 x 16 = 32, ceiling 3 x 16 = 48,
    # grows by 16 // 4 = 4, once a limit has run two steps
    lim = InflightLimit(per_step=16, max_staleness=2)
    assert (lim.limit, lim.ceiling, lim.step_up) == (32, 48, 4)
    assert lim.steer(wait_share=0.30, kv_peak=0.50, preempted=0, stale=0, rate=10.0) == 32
    assert lim.steer(0.30, 0.50, 0, 0, rate=10.0) == 36  # two steps at 32: grow
    assert lim.before == (32, 10.0)
    assert lim.steer(0.30, 0.50, 0, 0, 11.0) == 36  # settling
    assert lim.steer(0.30, 0.95, 0, 0, 11.0) == 36  # no slower (11 >= 0.95 x 10); no KV room
    assert lim.before is None and lim.cap == 48
    assert lim.steer(0.02, 0.50, 0, 0, 11.0) == 36  # the trainer hardly waited: hold
    for _ in range(4):  # each growth as fast as the steps before it
        lim.steer(0.30, 0.50, 0, 0, 11.0)
    assert lim.limit == 44  # 36 + 4 x 2 (a growth every other step)
    lim.steer(0.30, 0.50, 0, 0, 11.0)
    assert lim.limit == 48  # then the ceiling
    assert lim.steer(0.30, 0.50, preempted=2, stale=0, rate=11.0) == 36  # int(48 x 0.75)
    assert lim.steer(0.30, 0.50, 0, stale=1, rate=11.0) == 27  # int(36 x 0.75)
    for _ in range(20):
        lim.steer(0.0, 1.0, 1, 0, 11.0)
    assert lim.limit == 1  # never below one group
    # staleness 0: the bound admits one step's groups at most, and starts there
    assert InflightLimit(per_step=4, max_staleness=0).limit == 4


def test_a_growth_that_slowed_the_steps_is_undone_and_not_tried_again():
    lim = InflightLimit(per_step=16, max_staleness=2)
    lim.steer(0.30, 0.50, 0, 0, rate=20.0)
    assert lim.steer(0.30, 0.50, 0, 0, rate=22.0) == 36  # before: (32, 21.0)
    assert lim.steer(0.30, 0.50, 0, 0, rate=20.0) == 36
    # (20 + 19.8) / 2 = 19.9 < 0.95 x 21 = 19.95: back to 32, and 32 is the cap
    assert lim.steer(0.30, 0.50, 0, 0, rate=19.8) == 32
    assert lim.cap == 32
    for _ in range(6):  # the trainer still waits, but 32 was the better limit
        assert lim.steer(0.30, 0.50, 0, 0, rate=21.0) == 32
    # a growth that held its rate (19.95 is not under 0.95 x 21) is kept
    lim = InflightLimit(per_step=16, max_staleness=2)
    lim.steer(0.30, 0.50, 0, 0, 20.0)
    lim.steer(0.30, 0.50, 0, 0, 22.0)
    lim.steer(0.30, 0.50, 0, 0, 19.95)
    assert lim.steer(0.30, 0.50, 0, 0, 19.95) == 40 and lim.cap == 48


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
