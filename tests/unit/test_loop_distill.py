"""algo=opd's step in the loop (rlpost.loop.distill), without Ray: the teacher's
log-probs of the batch the controller built, the student's from the rollout (or the
trainer's old ones when the step computed them), and no advantage on an agent
episode's environment tokens."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlpost.config.compose import compose
from rlpost.data.samples import rollout_batch
from rlpost.loop.distill import Distillation
from rlpost.rollout.base import Completion, GenerationResult


class FakeTeacher:
    """A trainer group's ``logprobs``: -1.0 on every position, and what it was asked."""

    def __init__(self):
        self.calls: list[float] = []

    def logprobs(self, batch, temperature: float) -> torch.Tensor:
        self.calls.append(temperature)
        return torch.full(batch.input_ids_bt.shape, -1.0)


def episode_batch():
    # prompt [1, 2]; an episode: sampled 5, environment tokens 6 7, sampled 8
    episode = Completion([5, 6, 7, 8], [-0.5, 0.0, 0.0, -2.0], "", "stop", mask=[1, 0, 0, 1])
    single = Completion([9], [-1.5], "", "stop")  # a single-turn completion, then padding
    batch = rollout_batch([GenerationResult([1, 2], [episode, single])], pad_id=0)
    batch.advantages_bt = torch.full(batch.input_ids_bt.shape, 0.25)  # the task's
    return batch


def distillation(overrides: list[str]) -> tuple[Distillation, FakeTeacher]:
    cfg = compose(["algo=opd", "teacher.path=/t", *overrides])
    teacher = FakeTeacher()
    return Distillation(cfg, SimpleNamespace(teacher=teacher), temperature=0.7), teacher


def test_environment_tokens_get_no_advantage_and_the_rollout_is_the_student():
    step, teacher = distillation(["algo.opd.kl_coef=2.0"])
    batch, metrics = episode_batch(), {}
    step.apply(batch, metrics)
    assert teacher.calls == [0.7]  # the sampling temperature
    # row 0: positions 2..5 = sampled 5 (-0.5), env 6 7, sampled 8 (-2.0); teacher -1 everywhere
    # A = -2 (student - teacher): 5 -> -2 (-0.5 + 1) = -1.0 ; 8 -> -2 (-2 + 1) = 2.0
    # row 1: sampled 9 (-1.5) -> -2 (-1.5 + 1) = 1.0 ; the rest is padding
    expected = torch.tensor([[0, 0, -1.0, 0, 0, 2.0], [0, 0, 1.0, 0, 0, 0]])
    torch.testing.assert_close(batch.advantages_bt, expected)
    # reverse KL over the 3 sampled tokens: (0.5 - 1.0 - 0.5) / 3
    assert metrics["opd/reverse_kl"] == pytest.approx(-1.0 / 3)
    assert metrics["opd/teacher_logprob_mean"] == pytest.approx(-1.0)
    assert "timing/teacher_logprob_s" in metrics


def test_the_trainers_old_logprobs_are_the_student_when_computed_and_task_adds():
    step, _ = distillation(["algo.opd.task_advantage=true"])
    batch = episode_batch()
    batch.old_logp_bt = torch.full(batch.input_ids_bt.shape, -3.0)
    step.apply(batch, {})
    # A = 0.25 - (-3 + 1) = 2.25 on the 3 sampled tokens, 0 elsewhere
    expected = 2.25 * batch.response_mask_bt.float()
    torch.testing.assert_close(batch.advantages_bt, expected)
