"""Config checks of on-policy distillation (``algo=opd``): a teacher is named exactly
when the preset uses one. Whether the teacher's vocabulary is the student's needs
their tokenizers' files, and is checked with the run plan (``rlpost.plan.teacher``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlpost.config.groups import Config


def distill_checks(cfg: Config) -> list[str]:
    """``teacher.path`` given for ``algo=opd`` and only for it; DAPO's dynamic
    sampling only where the task reward's advantage is part of the advantage."""
    a, path = cfg.algo, cfg.teacher.path
    if a.needs_teacher and path is None:
        return [
            f"teacher.path=null: algo={a.name} distils the student towards a teacher's "
            "log-probs; give the teacher's model directory (one with the student's "
            "tokenizer), e.g. teacher.path=outputs/<a grpo run>/final"
        ]
    if not a.needs_teacher and path is not None:
        return [
            f"teacher.path={path}: only algo=opd uses a teacher, not algo={a.name}; drop "
            "teacher.path, or choose algo=opd"
        ]
    if a.needs_teacher and a.dynamic_sampling.enabled and not a.opd.task_advantage:
        return [
            "algo.dynamic_sampling.enabled=true: it drops the groups whose rewards agree, "
            "but under algo=opd without algo.opd.task_advantage=true the advantage is the "
            "teacher's, not the reward's, and those groups carry it too; turn one of them off"
        ]
    return []
