"""``algo=opd``'s step between the task advantages and the update: the teacher scores
the student's own samples token by token, and the advantage becomes the negative
reverse KL to it (``rlpost.algos.distill``), plus the task's where
``algo.opd.task_advantage``.

The student's log-probs are those it sampled with: the trainer's old log-probs when
the step computed them, else the rollout's (in sync mode the two agree to ~1e-4,
``rollout/logprob_abs_diff_max``; in the async modes the rollout's are the policy
that actually sampled). The teacher's come from its own frozen trainer group at the
same temperature. Tokens with response mask 0 -- prompt, padding, an agent
episode's environment and tool tokens -- get no advantage.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rlpost.algos import opd_advantage
from rlpost.config.groups import Config
from rlpost.trainers.batch import TrajectoryBatch

if TYPE_CHECKING:
    from rlpost.loop.roles import Workers


class Distillation:
    """Holds the run's workers (the teacher group is rebuilt with the others when a
    rank dies) and the distillation settings."""

    def __init__(self, cfg: Config, workers: Workers, temperature: float):
        self.cfg, self.workers, self.temperature = cfg.algo.opd, workers, temperature

    def apply(self, batch: TrajectoryBatch, metrics: dict[str, float]) -> None:
        """Replace ``batch.advantages_bt`` (the task's) by the distillation advantage;
        adds the ``opd/*`` metrics and ``timing/teacher_logprob_s``."""
        teacher = self.workers.teacher
        assert teacher is not None, "algo=opd starts a teacher group"
        start = time.perf_counter()
        teacher_logp_bt = teacher.logprobs(batch, temperature=self.temperature)
        metrics["timing/teacher_logprob_s"] = time.perf_counter() - start
        student_logp_bt = batch.old_logp_bt
        if student_logp_bt is None:  # the update's own forward gives them: the rollout's
            student_logp_bt = batch.rollout_logp_bt
        assert student_logp_bt is not None, "a rollout batch carries its log-probs"
        batch.advantages_bt, found = opd_advantage(
            student_logp_bt, teacher_logp_bt, batch.response_mask_bt, self.cfg,
            task_adv_bt=batch.advantages_bt,
        )  # fmt: skip
        metrics.update(found)
