"""``async.max_inflight=auto``: how many prompt groups generate at once, steered
each step from what the trainer and the engines report.

Additive increase, multiplicative decrease (as TCP's congestion window), with a
check that a growth paid off:

- **grow** by ``step_up`` groups (a quarter of a step's groups, at least one)
  when the trainer waited for samples (more than ``WAIT_SHARE`` of the step),
  the replicas still had KV-cache room (peak use under ``KV_ROOM``) and the
  current limit has run ``SETTLE`` steps: more requests in flight fill the
  engines' batches;
- **undo** a growth whose next ``SETTLE`` steps trained fewer samples a second
  than the ``SETTLE`` before it (under ``SLOWER`` of them), and grow no further:
  where generation and the update share processors, more requests in flight
  can slow the update by more than they speed the generation;
- **trim** to three quarters when an engine preempted requests (its KV cache
  was full: the preempted ones are computed again later) or groups were dropped
  as too stale (they were admitted too early to be trained): fewer in flight
  lose less work;
- otherwise **hold**.

The limit stays between one group and what the staleness bound can ever admit,
``(max_staleness + 1) x prompts_per_step``. It starts at the fixed default,
``2 x prompts_per_step`` (at most that ceiling). A trim cancels the youngest
groups first (``GroupProducer.set_limit``): they have sampled least.
"""

from __future__ import annotations

from dataclasses import dataclass, field

WAIT_SHARE = 0.05  # the trainer's share of a step spent waiting that asks for more
KV_ROOM = 0.9  # the KV-cache peak use under which the engines have room for more
TRIM = 0.75
SETTLE = 2  # steps at a limit before its samples a second are compared
SLOWER = 0.95  # a growth whose steps fall under this share of the rate before is undone


@dataclass
class InflightLimit:
    per_step: int
    max_staleness: int
    limit: int = 0
    # samples a second of the steps run at the current limit
    rates: list[float] = field(default_factory=list)
    # (limit, samples a second) before the last growth, until it is judged
    before: tuple[int, float] | None = None

    def __post_init__(self) -> None:
        self.ceiling = (self.max_staleness + 1) * self.per_step
        self.step_up = max(1, self.per_step // 4)
        if not self.limit:
            self.limit = min(2 * self.per_step, self.ceiling)
        self.cap = self.ceiling  # lowered to a limit whose growth slowed the steps

    def steer(
        self, wait_share: float, kv_peak: float, preempted: float, stale: float, rate: float
    ) -> int:
        """The limit for the next step, from this step's trainer wait share, the
        engines' KV-cache peak use (0..1), the requests preempted and groups dropped
        as stale during it, and the samples it trained a second."""
        self.rates.append(rate)
        if preempted > 0 or stale > 0:
            self.before = None
            return self._set(max(1, int(self.limit * TRIM)))
        if len(self.rates) < SETTLE:
            return self.limit
        now = sum(self.rates[-SETTLE:]) / SETTLE
        if self.before is not None:
            limit, then = self.before
            self.before = None
            if now < SLOWER * then:
                self.cap = limit
                return self._set(limit)
        if wait_share > WAIT_SHARE and kv_peak < KV_ROOM and self.limit < self.cap:
            self.before = (self.limit, now)
            return self._set(min(self.cap, self.limit + self.step_up))
        return self.limit

    def _set(self, limit: int) -> int:
        if limit != self.limit:
            self.rates = []
        self.limit = limit
        return limit
