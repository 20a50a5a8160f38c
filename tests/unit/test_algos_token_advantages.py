# Shapes: b = samples, t = tokens.
import math

import torch

from rlpost.algos import gae_advantage, masked_whiten, reinforce_pp_advantage


def test_reinforce_pp_return_to_go_ignores_masked_rewards():
    rewards_bt = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 5.0]])  # the 5 is on a pad token
    mask_bt = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv_bt = reinforce_pp_advantage(rewards_bt, mask_bt, gamma=0.5)
    # G row 0: [0.25, 0.5, 1] ; row 1: [1, 2] ; mean 4.75 / 5 = 0.95
    # deviations [-0.7, -0.45, 0.05 | 0.05, 1.05], unbiased var = 1.8 / 4 = 0.45
    expected = torch.tensor([[-0.7, -0.45, 0.05], [0.05, 1.05, 0.0]]) / math.sqrt(0.45)
    torch.testing.assert_close(adv_bt, expected, atol=1e-5, rtol=0)


def test_reinforce_pp_jumps_over_tool_tokens():
    rewards_bt = torch.tensor([[0.0, 9.0, 0.0, 1.0]])  # token 1 is tool output (mask 0)
    mask_bt = torch.tensor([[1, 0, 1, 1]])
    adv_bt = reinforce_pp_advantage(rewards_bt, mask_bt, gamma=0.5)
    # G: t3 = 1, t2 = 0.5, t1 passes 0.5 through, t0 = 0.5 * 0.5 = 0.25 (one discount, not two)
    # mean 1.75 / 3 = 0.58333 ; deviations [-1/3, -1/12, 5/12], unbiased var = 0.291667 / 2
    expected = torch.tensor([[-1 / 3, 0.0, -1 / 12, 5 / 12]]) / math.sqrt(0.291667 / 2)
    torch.testing.assert_close(adv_bt, expected, atol=1e-5, rtol=0)


def test_gae_hand_values():
    rewards_bt = torch.tensor([[0.0, 0.0, 1.0]])
    values_bt = torch.tensor([[0.5, 0.6, 0.7]])
    mask_bt = torch.ones(1, 3)
    adv_bt, returns_bt = gae_advantage(rewards_bt, values_bt, mask_bt, gamma=0.9, lam=0.8)
    # t2: delta = 1 - 0.7 = 0.3                 A = 0.3
    # t1: delta = 0.9 * 0.7 - 0.6 = 0.03        A = 0.03 + 0.72 * 0.3 = 0.246
    # t0: delta = 0.9 * 0.6 - 0.5 = 0.04        A = 0.04 + 0.72 * 0.246 = 0.21712
    # returns = A + V = [0.71712, 0.846, 1.0]
    torch.testing.assert_close(returns_bt, torch.tensor([[0.71712, 0.846, 1.0]]))
    raw_bt = torch.tensor([[0.21712, 0.246, 0.3]])
    torch.testing.assert_close(adv_bt, masked_whiten(raw_bt, mask_bt, 1e-6))


def test_gae_with_gamma_lambda_one_returns_the_reward_to_go():
    values_bt = torch.tensor([[0.5, 0.6, 0.7]])
    _, returns_bt = gae_advantage(
        torch.tensor([[0.0, 0.0, 1.0]]), values_bt, torch.ones(1, 3), gamma=1.0, lam=1.0
    )
    # gamma = lam = 1: A_t + V_t = sum of future rewards = 1 at every token
    torch.testing.assert_close(returns_bt, torch.ones(1, 3))


def test_gae_skips_tool_tokens_between_turns():
    rewards_bt = torch.tensor([[0.0, 0.0, 1.0]])
    values_bt = torch.tensor([[0.5, 9.0, 0.7]])  # the tool token's value is garbage
    mask_bt = torch.tensor([[1, 0, 1]])
    adv_bt, returns_bt = gae_advantage(rewards_bt, values_bt, mask_bt, gamma=0.9, lam=0.8)
    # t2: A = 1 - 0.7 = 0.3 ; t1 skipped: next V stays 0.7, next A stays 0.3
    # t0: delta = 0.9 * 0.7 - 0.5 = 0.13, A = 0.13 + 0.72 * 0.3 = 0.346 ; returns [0.846, 0, 1.0]
    torch.testing.assert_close(returns_bt, torch.tensor([[0.846, 0.0, 1.0]]))
    torch.testing.assert_close(
        adv_bt, masked_whiten(torch.tensor([[0.346, 0.0, 0.3]]), mask_bt, 1e-6)
    )
    # same as the two-token response with the tool token cut out
    cut_adv_bt, cut_returns_bt = gae_advantage(
        torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.7]]), torch.ones(1, 2), gamma=0.9, lam=0.8
    )
    torch.testing.assert_close(adv_bt[:, [0, 2]], cut_adv_bt)
    torch.testing.assert_close(returns_bt[:, [0, 2]], cut_returns_bt)


def _naive_gae(rewards, values, mask, gamma, lam):
    """Plain GAE on the response tokens only, the tool / pad tokens cut out."""
    out_returns = [[0.0] * len(r) for r in rewards]
    for i in range(len(rewards)):
        pos = [t for t in range(len(mask[i])) if mask[i][t]]
        adv = 0.0
        for k in reversed(range(len(pos))):
            t = pos[k]
            v_next = values[i][pos[k + 1]] if k + 1 < len(pos) else 0.0
            adv = rewards[i][t] + gamma * v_next - values[i][t] + gamma * lam * adv
            out_returns[i][t] = adv + values[i][t]
    return out_returns


def test_gae_matches_naive_loop_on_random_multi_turn_masks():
    gen = torch.Generator().manual_seed(4)
    rewards_bt = torch.randn(5, 9, generator=gen)
    values_bt = torch.randn(5, 9, generator=gen)
    mask_bt = (torch.rand(5, 9, generator=gen) > 0.4).long()
    mask_bt[:, -2:] = 0  # trailing pad as well as gaps
    _, returns_bt = gae_advantage(rewards_bt, values_bt, mask_bt, gamma=0.95, lam=0.9)
    ref = _naive_gae(rewards_bt.tolist(), values_bt.tolist(), mask_bt.tolist(), 0.95, 0.9)
    torch.testing.assert_close(returns_bt, torch.tensor(ref))


def test_masked_whiten_uses_only_mask_tokens():
    x_bt = torch.tensor([[1.0, 3.0, 100.0]])
    out_bt = masked_whiten(x_bt, torch.tensor([[1, 1, 0]]), eps=0.0)
    # mean 2, unbiased var = (1 + 1) / 1 = 2 -> [-1, 1] / sqrt(2); the 100 is ignored and zeroed
    torch.testing.assert_close(out_bt, torch.tensor([[-1.0, 1.0, 0.0]]) / math.sqrt(2))
