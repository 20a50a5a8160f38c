"""A multi-turn response mask has gaps (environment tokens between model turns): the
loss, its gradient and every advantage estimator must ignore what lies under a 0.

Shapes: b = samples, t = tokens. Mask of the running example, one sample:
  t:    0  1  2  3  4  5  6  7  8
  mask: 0  0  1  1  0  0  1  1  1     (2 env tokens, a model turn, 2 env tokens, a model turn)
"""

from __future__ import annotations

import math

import torch

from algos import (
    AdvantageConfig,
    LossNorm,
    PolicyLossConfig,
    aggregate,
    compute_advantages,
    gae_advantage,
    last_token_rewards,
    masked_whiten,
    ppo_clip_loss,
    reinforce_pp_advantage,
)

MASK = [0, 0, 1, 1, 0, 0, 1, 1, 1]
MODEL = [2, 3, 6, 7, 8]  # the mask-1 positions


def _mask_bt() -> torch.Tensor:
    return torch.tensor([MASK], dtype=torch.float32)


def test_token_mean_counts_only_model_tokens_and_gap_tokens_get_no_gradient():
    loss_bt = torch.arange(1.0, 10.0)[None].requires_grad_()  # [1, 2, ..., 9]
    loss = aggregate(loss_bt, _mask_bt(), "token-mean", LossNorm(global_tokens=5, global_samples=1))
    # (3 + 4 + 7 + 8 + 9) / 5 = 31 / 5 = 6.2 ; the 5 counts mask-1 tokens only
    torch.testing.assert_close(loss, torch.tensor(6.2))
    loss.backward()
    assert loss_bt.grad is not None
    torch.testing.assert_close(loss_bt.grad, _mask_bt() / 5)  # 0.2 on model tokens, 0 on env
    seq = aggregate(
        loss_bt.detach(), _mask_bt(), "seq-mean-token-mean", LossNorm(5, global_samples=1)
    )
    torch.testing.assert_close(seq, torch.tensor(6.2))  # n_i = 5 too, not 9 or the span 7


def test_ppo_loss_ignores_garbage_under_the_gap():
    # env tokens carry absurd log-probs and advantages; the loss must not see them
    logp_bt = torch.tensor([[50.0, -50.0, -1.0, -2.0, 80.0, -80.0, -1.5, -0.5, -1.0]])
    logp_bt.requires_grad_()
    old_bt = logp_bt.detach().clone()
    old_bt[0, MODEL] -= 0.1  # ratio e^0.1 = 1.105 on model tokens, inside the 0.2 clip
    adv_bt = torch.tensor([[7.0, 7.0, 1.0, 1.0, -7.0, -7.0, 1.0, 1.0, 1.0]])
    loss, metrics = ppo_clip_loss(
        logp_bt, old_bt, adv_bt, _mask_bt(), PolicyLossConfig(), LossNorm(5, 1)
    )
    # each model token: -A r = -1.105 ; token mean over 5 tokens = -1.105
    torch.testing.assert_close(loss, torch.tensor(-math.exp(0.1)))
    assert metrics["actor/pg_clipfrac"] == 0.0
    loss.backward()
    assert logp_bt.grad is not None
    # d(-A r)/d logp = -A r / 5 = -0.221 on model tokens, exactly 0 under the gap
    expected_bt = -_mask_bt() * math.exp(0.1) / 5
    torch.testing.assert_close(logp_bt.grad, expected_bt)


def test_outcome_reward_lands_on_the_last_model_token():
    rewards_bt = last_token_rewards(torch.tensor([2.0]), _mask_bt())
    assert rewards_bt.tolist() == [[0, 0, 0, 0, 0, 0, 0, 0, 2.0]]
    rewards_bt = last_token_rewards(torch.tensor([2.0]), torch.tensor([[0, 1, 1, 0, 0.0]]))
    assert rewards_bt.tolist() == [[0, 0, 2.0, 0, 0]]  # a response ending in env tokens


def test_gae_bridges_the_gap_without_bootstrapping_from_env_values():
    rewards_bt = last_token_rewards(torch.tensor([1.0]), _mask_bt())
    values_bt = torch.tensor([[9.0, 9.0, 0.2, 0.3, 9.0, 9.0, 0.4, 0.5, 0.6]])  # 9 = garbage
    adv_bt, returns_bt = gae_advantage(rewards_bt, values_bt, _mask_bt(), gamma=0.9, lam=0.8)
    # t8: delta = 1 - 0.6 = 0.4                          A = 0.4
    # t7: delta = 0.9 * 0.6 - 0.5 = 0.04                 A = 0.04 + 0.72 * 0.4 = 0.328
    # t6: delta = 0.9 * 0.5 - 0.4 = 0.05                 A = 0.05 + 0.72 * 0.328 = 0.28616
    # t5, t4 (env): skipped, next V stays 0.4 (not 9), next A stays 0.28616
    # t3: delta = 0.9 * 0.4 - 0.3 = 0.06                 A = 0.06 + 0.72 * 0.28616 = 0.2660352
    # t2: delta = 0.9 * 0.3 - 0.2 = 0.07                 A = 0.07 + 0.72 * 0.2660352 = 0.26154534
    raw = [0.0, 0.0, 0.26154534, 0.2660352, 0.0, 0.0, 0.28616, 0.328, 0.4]
    returns = [a + v if m else 0.0 for a, v, m in zip(raw, values_bt[0].tolist(), MASK)]
    torch.testing.assert_close(returns_bt, torch.tensor([returns]))  # t2: 0.46154534 ...
    torch.testing.assert_close(adv_bt, masked_whiten(torch.tensor([raw]), _mask_bt(), 1e-6))
    assert adv_bt[0, [0, 1, 4, 5]].eq(0).all()


def test_reinforce_pp_passes_the_return_through_the_gap():
    rewards_bt = torch.tensor([[5.0, 5.0, 0.0, 0.0, 5.0, 5.0, 0.0, 0.0, 1.0]])  # 5s are on env
    adv_bt = reinforce_pp_advantage(rewards_bt, _mask_bt(), gamma=0.5)
    # G8 = 1, G7 = 0.5, G6 = 0.25, env passes 0.25 through, G3 = 0.125, G2 = 0.0625
    g = [0.0625, 0.125, 0.25, 0.5, 1.0]
    mean = sum(g) / 5  # 1.9375 / 5 = 0.3875
    std = math.sqrt(sum((x - mean) ** 2 for x in g) / 4)  # unbiased
    expected = [0.0] * 9
    for t, x in zip(MODEL, g):
        expected[t] = (x - mean) / std
    torch.testing.assert_close(adv_bt, torch.tensor([expected]), atol=1e-5, rtol=0)


def test_group_estimators_broadcast_only_onto_model_tokens():
    mask_bt = torch.tensor([MASK, [0, 1, 1, 1, 0, 1, 1, 0, 0]], dtype=torch.float32)
    scores = {"total": torch.tensor([1.0, 0.0])}
    adv_bt, _ = compute_advantages(
        AdvantageConfig(estimator="grpo"), scores_b=scores, group_ids_b=[0, 0], mask_bt=mask_bt
    )
    # mean 0.5, unbiased std 0.7071 -> A = +-0.7071, on mask-1 tokens only
    a = 0.5 / math.sqrt(0.5)
    torch.testing.assert_close(
        adv_bt, torch.stack([a * mask_bt[0], -a * mask_bt[1]]), atol=1e-5, rtol=0
    )
    adv_bt, _ = compute_advantages(
        AdvantageConfig(estimator="reinforce_pp_baseline"),
        scores_b=scores, group_ids_b=[0, 0], mask_bt=mask_bt,
    )  # fmt: skip
    # (s - mean) = +-0.5 on 5 + 5 tokens: mean 0, unbiased std sqrt(2.5 / 9) -> +-0.9487
    b = 0.5 / math.sqrt(2.5 / 9)
    torch.testing.assert_close(
        adv_bt, torch.stack([b * mask_bt[0], -b * mask_bt[1]]), atol=1e-4, rtol=0
    )
