"""The worker groups one run holds, by role."""

from __future__ import annotations

import dataclasses

from rlpost.serving.rollout_group import RolloutGroup
from rlpost.workers.trainer_worker import TrainerGroup


@dataclasses.dataclass
class Workers:
    policy: TrainerGroup
    rollout: RolloutGroup
    reference: TrainerGroup | None = None
    critic: TrainerGroup | None = None
    teacher: TrainerGroup | None = None  # algo=opd: the frozen teacher (teacher.path)


# policy, reference, critic, teacher
TrainerGroups = tuple[TrainerGroup, TrainerGroup | None, TrainerGroup | None, TrainerGroup | None]
