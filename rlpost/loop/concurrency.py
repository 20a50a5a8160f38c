"""``async.max_inflight=auto``: how many prompt groups generate at once, steered
each step from what the trainer and the engines report.

Additive increase, multiplicative decrease (as TCP's congestion window):

- **grow** by ``step_up`` groups (a quarter of a step's groups, at least one)
  when the trainer waited for samples (more than ``WAIT_SHARE`` of the step)
  and the replicas still had KV-cache room (peak use under ``KV_ROOM``): more
  requests in flight fill the engines' batches;
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

from dataclasses import dataclass

WAIT_SHARE = 0.05  # the trainer's share of a step spent waiting that asks for more
KV_ROOM = 0.9  # the KV-cache peak use under which the engines have room for more
TRIM = 0.75


@dataclass
class InflightLimit:
    per_step: int
    max_staleness: int
    limit: int = 0

    def __post_init__(self) -> None:
        self.ceiling = (self.max_staleness + 1) * self.per_step
        self.step_up = max(1, self.per_step // 4)
        if not self.limit:
            self.limit = min(2 * self.per_step, self.ceiling)

    def steer(self, wait_share: float, kv_peak: float, preempted: float, stale: float) -> int:
        """The limit for the next step, from this step's trainer wait share, the
        engines' KV-cache peak use (0..1) and the requests preempted and groups
        dropped as stale during it."""
        if preempted > 0 or stale > 0:
            self.limit = max(1, int(self.limit * TRIM))
        elif wait_share > WAIT_SHARE and kv_peak < KV_ROOM:
            self.limit = min(self.ceiling, self.limit + self.step_up)
        return self.limit
