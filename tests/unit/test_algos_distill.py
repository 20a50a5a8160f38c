# Shapes: b = samples, t = tokens, v = vocab.
"""On-policy distillation's advantage (rlpost.algos.distill): hand-computed values, the
masks of agent episodes, the combined form with the task advantage, and a parity
check of its gradient against the exact reverse KL."""

import pytest
import torch
import torch.nn.functional as F

from rlpost.algos import DistillConfig, LossNorm, PolicyLossConfig, build_policy_loss, opd_advantage

STUDENT_BT = torch.tensor([[0.0, -0.5, -1.0, -2.0], [0.0, -0.2, -0.3, 0.0]])
TEACHER_BT = torch.tensor([[0.0, -0.1, -1.5, -2.0], [0.0, -0.7, -0.3, -9.0]])
# row 0: a prompt token, then three sampled tokens; row 1: a prompt token, one sampled
# token, an environment token (a tool's output: mask 0) and padding
MASK_BT = torch.tensor([[0, 1, 1, 1], [0, 1, 0, 0]])


def test_the_advantage_is_the_negative_reverse_kl_on_sampled_tokens():
    adv_bt, metrics = opd_advantage(STUDENT_BT, TEACHER_BT, MASK_BT, DistillConfig(kl_coef=0.5))
    # d = student - teacher: row 0 [., -0.4, 0.5, 0.0], row 1 [., 0.5, (0), (9)]
    # A = -0.5 d on mask tokens: row 0 [0, 0.2, -0.25, 0], row 1 [0, -0.25, 0, 0]
    expected = torch.tensor([[0.0, 0.2, -0.25, 0.0], [0.0, -0.25, 0.0, 0.0]])
    torch.testing.assert_close(adv_bt, expected)
    # the environment token and the padding get exactly 0, whatever their log-probs
    assert adv_bt[1, 2].item() == 0.0 and adv_bt[1, 3].item() == 0.0
    # means over the 4 mask tokens: d (-0.4 + 0.5 + 0 + 0.5) / 4 = 0.15
    assert metrics["opd/reverse_kl"] == pytest.approx(0.15)
    # teacher (-0.1 - 1.5 - 2.0 - 0.7) / 4 = -1.075 ; student (-0.5 - 1 - 2 - 0.2) / 4 = -0.925
    assert metrics["opd/teacher_logprob_mean"] == pytest.approx(-1.075)
    assert metrics["opd/student_logprob_mean"] == pytest.approx(-0.925)
    # advantage (0.2 - 0.25 + 0 - 0.25) / 4 = -0.075
    assert metrics["opd/advantage_mean"] == pytest.approx(-0.075)


def test_a_token_the_teacher_likes_more_gets_a_positive_advantage():
    student_bt, teacher_bt = torch.tensor([[-2.0, -0.1]]), torch.tensor([[-0.5, -0.1]])
    adv_bt, _ = opd_advantage(student_bt, teacher_bt, torch.ones(1, 2), DistillConfig())
    # lambda 1: A = -(-2 + 0.5) = 1.5 where the teacher is surer; 0 where both agree
    torch.testing.assert_close(adv_bt, torch.tensor([[1.5, 0.0]]))


def test_the_task_advantage_is_added_when_asked():
    task_adv_bt = torch.tensor([[1.0, 1.0, 1.0, 1.0], [-1.0, -1.0, -1.0, -1.0]])
    cfg = DistillConfig(kl_coef=1.0, task_advantage=True)
    adv_bt, _ = opd_advantage(STUDENT_BT, TEACHER_BT, MASK_BT, cfg, task_adv_bt=task_adv_bt)
    # A = A_task - d: row 0 [., 1 + 0.4, 1 - 0.5, 1 - 0] ; row 1 [., -1 - 0.5, masked, masked]
    expected = torch.tensor([[0.0, 1.4, 0.5, 1.0], [0.0, -1.5, 0.0, 0.0]])
    torch.testing.assert_close(adv_bt, expected)
    # off (the default), the task advantage passed in is ignored
    plain_bt, _ = opd_advantage(STUDENT_BT, TEACHER_BT, MASK_BT, DistillConfig(), task_adv_bt)
    torch.testing.assert_close(plain_bt, -(STUDENT_BT - TEACHER_BT) * MASK_BT)
    with pytest.raises(ValueError, match="task_adv_bt"):
        opd_advantage(STUDENT_BT, TEACHER_BT, MASK_BT, cfg)


def test_the_advantage_carries_no_gradient():
    student_bt = STUDENT_BT.clone().requires_grad_(True)
    adv_bt, _ = opd_advantage(student_bt, TEACHER_BT, MASK_BT, DistillConfig())
    assert not adv_bt.requires_grad


def test_the_reverse_kl_metric_estimates_kl_student_teacher():
    # Parity with the exact KL(p || q) of two distributions over 5 tokens: the mean of
    # d = log p(y) - log q(y) over samples y ~ p is an unbiased estimate of it.
    torch.manual_seed(0)
    logp_v = torch.log_softmax(torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5]), -1)
    logq_v = torch.log_softmax(torch.tensor([0.0, 1.5, 0.5, -0.5, 0.0]), -1)
    y_b = torch.multinomial(logp_v.exp(), 200_000, replacement=True)
    student_bt, teacher_bt = logp_v[y_b].unsqueeze(1), logq_v[y_b].unsqueeze(1)
    _, metrics = opd_advantage(student_bt, teacher_bt, torch.ones_like(student_bt), DistillConfig())
    exact = F.kl_div(logq_v, logp_v, log_target=True, reduction="sum").item()  # KL(p || q)
    assert exact == pytest.approx(0.6263, abs=1e-4)  # sum_v p_v (log p_v - log q_v)
    assert metrics["opd/reverse_kl"] == pytest.approx(exact, abs=0.01)


def test_the_policy_loss_with_this_advantage_descends_the_reverse_kl():
    # Enumerate the 5 tokens instead of sampling (each row one token y, weighted by
    # p(y) through the token-mean over "samples" drawn in proportion): on-policy
    # (old = current), the clipped loss's gradient is E_p[-A grad log p] =
    # E_p[(log p - log q) grad log p] = grad KL(p || q), since E_p[grad log p] = 0.
    logits_v = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5], requires_grad=True)
    logq_v = torch.log_softmax(torch.tensor([0.0, 1.5, 0.5, -0.5, 0.0]), -1)
    logp_v = torch.log_softmax(logits_v, -1)
    p_v = logp_v.exp().detach()
    adv_bt, _ = opd_advantage(
        logp_v.detach().unsqueeze(1), logq_v.unsqueeze(1), torch.ones(5, 1), DistillConfig()
    )
    cfg = PolicyLossConfig(name="ppo_clip")
    # weight each token's row by 5 p(y): the token-mean over 5 rows is then the p-weighted sum
    weighted_adv_bt = adv_bt * 5 * p_v.unsqueeze(1)
    logp_bt = logp_v.unsqueeze(1)
    norm = LossNorm(global_tokens=5, global_samples=5)
    loss, _ = build_policy_loss(cfg)(
        logp_bt, logp_bt.detach(), weighted_adv_bt, torch.ones(5, 1), cfg, norm
    )
    (grad_surrogate,) = torch.autograd.grad(loss, logits_v)
    kl = F.kl_div(logq_v, torch.log_softmax(logits_v, -1), log_target=True, reduction="sum")
    (grad_kl,) = torch.autograd.grad(kl, logits_v)
    torch.testing.assert_close(grad_surrogate, grad_kl, atol=1e-6, rtol=1e-5)
