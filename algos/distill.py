"""On-policy distillation: a teacher scores the student's own samples token by token.

Shapes: b = samples, t = tokens (aligned with the batch's ``input_ids_bt``).

The student samples y ~ pi_theta; the teacher gives log pi_T(y_t | y_<t) for the same
tokens. The per-token reverse KL estimate on the sampled token is
``d_t = log pi_theta(y_t) - log pi_T(y_t)`` (its expectation under pi_theta is
KL(pi_theta || pi_T), the mode-seeking direction: Agarwal et al. 2024, "On-Policy
Distillation of Language Models" (GKD), sec. 3 with beta = 1; Thinking Machines,
"On-Policy Distillation", 2025). Its negative is the advantage of a policy-gradient
step with discount 0, so the clipped policy loss minimises the reverse KL; slime's OPD
adds it to the task reward's advantage, ``A_t = A_task - lambda * d_t``.
"""

from __future__ import annotations

import torch

from rlpost.algos.aggregation import masked_mean
from rlpost.algos.config import DistillConfig


def opd_advantage(
    student_logp_bt: torch.Tensor,
    teacher_logp_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    cfg: DistillConfig,
    task_adv_bt: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``A_t = [A_task_t] - kl_coef * (log pi_theta(y_t) - log pi_T(y_t))`` on tokens
    with mask 1, exactly 0 elsewhere (prompt, padding, and the environment's tokens in
    an agent episode: nobody sampled those, so there is nothing to distil).

    ``student_logp_bt``: the log-probs the student sampled with (the rollout's, or the
    trainer's old log-probs); ``task_adv_bt`` is added only when
    ``cfg.task_advantage`` (it must then be given). Both log-prob tensors are
    detached: the advantage is a constant of the update.

    Metrics (means over the mask tokens): ``opd/reverse_kl`` (of d_t),
    ``opd/teacher_logprob_mean``, ``opd/student_logprob_mean``, ``opd/advantage_mean``.
    """
    mask_bt = mask_bt.to(student_logp_bt.dtype)
    d_bt = (student_logp_bt - teacher_logp_bt).detach()
    adv_bt = -cfg.kl_coef * d_bt
    if cfg.task_advantage:
        if task_adv_bt is None:
            raise ValueError("DistillConfig.task_advantage is set: pass task_adv_bt")
        adv_bt = adv_bt + task_adv_bt
    adv_bt = adv_bt * mask_bt
    metrics = {
        "opd/reverse_kl": masked_mean(d_bt, mask_bt).item(),
        "opd/teacher_logprob_mean": masked_mean(teacher_logp_bt, mask_bt).item(),
        "opd/student_logprob_mean": masked_mean(student_logp_bt, mask_bt).item(),
        "opd/advantage_mean": masked_mean(adv_bt, mask_bt).item(),
    }
    return adv_bt, metrics
