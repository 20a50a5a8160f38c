"""A multi-turn response mask has gaps (environment tokens between model turns): every
loss aggregation, policy / value / SFT loss, the whole policy objective (entropy, KL,
importance weight) and every advantage estimator must ignore what lies under a 0.

Hand-computed values for each, and parity with the same computation on the gapless
layout (the gap tokens deleted) for every entry of the registries, so a new
aggregation, estimator or policy loss is covered when it is registered.

Shapes: b = samples, t = tokens. Mask of the running example, one sample:
  t:    0  1  2  3  4  5  6  7  8
  mask: 0  0  1  1  0  0  1  1  1     (2 env tokens, a model turn, 2 env tokens, a model turn)
"""

from __future__ import annotations

import math

import pytest
import torch

from rlpost.algos import (
    ADVANTAGE_ESTIMATORS,
    AGGREGATIONS,
    POLICY_LOSSES,
    AdvantageConfig,
    LossNorm,
    PolicyLossConfig,
    aggregate,
    clipped_value_loss,
    compute_advantages,
    gae_advantage,
    gspo_loss,
    kl_reward_penalty,
    last_token_rewards,
    masked_whiten,
    ppo_clip_loss,
    reinforce_pp_advantage,
    sft_loss,
)
from rlpost.trainers.batch import TrajectoryBatch
from rlpost.trainers.fsdp.engine import RegularizerConfig
from rlpost.trainers.objectives import policy_objective

MASK = [0, 0, 1, 1, 0, 0, 1, 1, 1]
MODEL = [2, 3, 6, 7, 8]  # the mask-1 positions


def _floats(metrics: dict) -> dict[str, float]:
    """A loss's metrics (0-d tensors) as floats, for ``pytest.approx``."""
    return {k: float(v) for k, v in metrics.items()}


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


# --- every aggregation, estimator and loss: hand values, and parity with the gaps removed ---
#
# The reference for "treats the gap correctly" is the same computation on the compact
# layout: each row with its mask-0 tokens deleted, left-aligned and right-padded (what a
# single-turn response of the same model tokens looks like). Garbage sits under every gap.

MASK2 = [0, 1, 1, 1, 0, 1, 1, 0, 0]  # model turns of 3 and 2 tokens, an env token, padding
MASK3 = [1, 1, 0, 0, 0, 1, 0, 0, 0]  # a model token after three env tokens


def _masks(*rows: list[int]) -> torch.Tensor:
    return torch.tensor(list(rows), dtype=torch.float32)


def _compact(x_bt: torch.Tensor, mask_bt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ``x_bt`` without their mask-0 tokens, right-padded with 0; and their mask."""
    width = int(mask_bt.sum(-1).max())
    out_bt = torch.zeros(x_bt.shape[0], width, dtype=x_bt.dtype)
    out_mask_bt = torch.zeros(x_bt.shape[0], width, dtype=mask_bt.dtype)
    for i in range(x_bt.shape[0]):
        keep = x_bt[i][mask_bt[i].bool()]
        out_bt[i, : len(keep)] = keep
        out_mask_bt[i, : len(keep)] = 1
    return out_bt, out_mask_bt


def _spread(compact_bt: torch.Tensor, mask_bt: torch.Tensor) -> torch.Tensor:
    """Inverse of ``_compact``: the compact rows put back on the mask-1 positions, 0 elsewhere."""
    out_bt = torch.zeros(mask_bt.shape, dtype=compact_bt.dtype)
    for i in range(mask_bt.shape[0]):
        n = int(mask_bt[i].sum())
        out_bt[i, mask_bt[i].bool()] = compact_bt[i, :n]
    return out_bt


def _gapped(model_bt: list[list[float]], mask_bt: torch.Tensor, garbage: float) -> torch.Tensor:
    """Model-token values on the mask-1 positions, ``garbage`` (+ position) on the gaps."""
    out_bt = garbage + torch.arange(mask_bt.shape[1], dtype=torch.float32).expand_as(mask_bt)
    out_bt = out_bt.clone()
    for i, row in enumerate(model_bt):
        out_bt[i, mask_bt[i].bool()] = torch.tensor(row)
    return out_bt


def test_seq_mean_token_sum_and_its_norm_count_only_model_tokens():
    mask_bt = _masks(MASK, MASK2)
    loss_bt = torch.arange(1.0, 10.0).repeat(2, 1).requires_grad_()  # [1, 2, ..., 9] twice
    norm = LossNorm(global_tokens=10, global_samples=2, norm_const=16.0)
    # row 0 sums t 2,3,6,7,8: 3+4+7+8+9 = 31 ; row 1 sums t 1,2,3,5,6: 2+3+4+6+7 = 22
    loss = aggregate(loss_bt, mask_bt, "seq-mean-token-sum", norm)
    torch.testing.assert_close(loss, torch.tensor(26.5))  # (31 + 22) / 2 samples
    loss.backward()
    assert loss_bt.grad is not None
    torch.testing.assert_close(loss_bt.grad, mask_bt / 2)  # 1/2 on model tokens, 0 on env
    loss_bt.grad = None
    loss = aggregate(loss_bt, mask_bt, "seq-mean-token-sum-norm", norm)
    torch.testing.assert_close(loss, torch.tensor(53 / 32))  # 53 / (2 samples * 16) = 1.65625
    loss.backward()
    torch.testing.assert_close(loss_bt.grad, mask_bt / 32)


@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_every_aggregation_equals_the_gapless_layout(mode):
    mask_bt = _masks(MASK, MASK2, MASK3)
    model = [[0.5, -1.0, 2.0, 0.25, 3.0], [1.5, 1.0, -2.0, 0.75, 4.0], [2.5, -0.5, 1.0]]
    loss_bt = _gapped(model, mask_bt, garbage=1e3).requires_grad_()
    compact_bt, compact_mask_bt = _compact(loss_bt.detach(), mask_bt)
    compact_bt.requires_grad_()
    norm = LossNorm(global_tokens=13, global_samples=3, norm_const=16.0)  # 5 + 5 + 3 tokens
    loss = aggregate(loss_bt, mask_bt, mode, norm)
    ref = aggregate(compact_bt, compact_mask_bt, mode, norm)
    torch.testing.assert_close(loss, ref)
    assert loss.item() < 100  # none of the 1e3 garbage got in
    (loss + ref).backward()
    assert loss_bt.grad is not None and compact_bt.grad is not None
    assert loss_bt.grad[mask_bt == 0].eq(0).all()
    torch.testing.assert_close(loss_bt.grad, _spread(compact_bt.grad, mask_bt))


def _estimator_cfg(name: str) -> AdvantageConfig:
    return AdvantageConfig(
        estimator=name, gamma=0.9, lam=0.8, reward_weights=(("accuracy", 1.0), ("format", 0.5))
    )


SCORES = {
    "total": torch.tensor([1.0, 0.0, 0.5, 0.25]),
    "accuracy": torch.tensor([1.0, 0.0, 1.0, 1.0]),
    "format": torch.tensor([0.0, 1.0, 1.0, 0.0]),
}


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_every_estimator_equals_the_gapless_layout(name):
    """Advantages and returns on the gapped rows are the gapless ones spread back onto the
    model tokens, and exactly 0 under every gap, whatever values lie there."""
    mask_bt = _masks(MASK, MASK2, MASK3, MASK)
    model_values = [[0.2, 0.3, 0.4, 0.5, 0.6], [0.1, -0.2, 0.3, 0.0, 0.7], [0.5, 0.4, 0.9]]
    values_bt = _gapped([*model_values, model_values[0]], mask_bt, garbage=9.0)
    compact_values_bt, compact_mask_bt = _compact(values_bt, mask_bt)
    kwargs = dict(scores_b=SCORES, group_ids_b=[0, 0, 1, 1])
    cfg = _estimator_cfg(name)
    adv_bt, returns_bt = compute_advantages(cfg, mask_bt=mask_bt, values_bt=values_bt, **kwargs)
    ref_adv_bt, ref_returns_bt = compute_advantages(
        cfg, mask_bt=compact_mask_bt, values_bt=compact_values_bt, **kwargs
    )
    assert adv_bt[mask_bt == 0].eq(0).all()
    assert adv_bt.abs().sum() > 0  # the case carries signal
    torch.testing.assert_close(adv_bt, _spread(ref_adv_bt, mask_bt))
    assert (returns_bt is None) == (ref_returns_bt is None)
    if returns_bt is not None and ref_returns_bt is not None:
        torch.testing.assert_close(returns_bt, _spread(ref_returns_bt, mask_bt))


def test_rloo_and_dr_grpo_broadcast_only_onto_model_tokens():
    mask_bt = _masks(MASK, MASK2, MASK3)
    scores = {"total": torch.tensor([1.0, 0.0, 0.5])}  # one group of three
    adv_bt, returns_bt = compute_advantages(
        AdvantageConfig(estimator="rloo"), scores_b=scores, group_ids_b=[0, 0, 0], mask_bt=mask_bt
    )
    # A_i = s_i - mean(others): 1 - (0 + 0.5)/2 = 0.75 ; 0 - (1 + 0.5)/2 = -0.75 ; 0.5 - 0.5 = 0
    expected = torch.tensor([0.75, -0.75, 0.0])[:, None] * mask_bt
    torch.testing.assert_close(adv_bt, expected)
    assert returns_bt is None
    # Dr.GRPO (configs/algo/dr_grpo.yaml): grpo without the std division, A_i = s_i - mean
    adv_bt, _ = compute_advantages(
        AdvantageConfig(estimator="grpo", norm_by_std=False),
        scores_b=scores, group_ids_b=[0, 0, 0], mask_bt=mask_bt,
    )  # fmt: skip
    # mean = 1.5 / 3 = 0.5 -> A = 0.5, -0.5, 0
    torch.testing.assert_close(adv_bt, torch.tensor([0.5, -0.5, 0.0])[:, None] * mask_bt)


def test_gdpo_broadcasts_only_onto_model_tokens():
    mask_bt = _masks(MASK, MASK2, MASK3, MASK)
    adv_bt, _ = compute_advantages(
        _estimator_cfg("gdpo"), scores_b=SCORES, group_ids_b=[0, 0, 1, 1], mask_bt=mask_bt
    )
    # per reward and group, (r - mean) / std with unbiased std 0.7071 for a split pair:
    #   accuracy: group 0 [1, 0] -> +-0.7071 ; group 1 [1, 1] -> 0, 0
    #   format:   group 0 [0, 1] -> -+0.7071 ; group 1 [1, 0] -> +-0.7071
    # 1.0 * acc + 0.5 * fmt = [0.3536, -0.3536, 0.3536, -0.3536]
    # batch: mean 0, unbiased std sqrt(4 * 0.125 / 3) = 0.4082 -> +-0.3536 / 0.4082 = +-0.8660
    a = math.sqrt(3) / 2
    expected = torch.tensor([a, -a, a, -a])[:, None] * mask_bt
    torch.testing.assert_close(adv_bt, expected, atol=1e-4, rtol=0)


def _gspo_gapped(model_log_ratio: list[float], gap_log_ratio: float):
    """One sample with MASK; logp is garbage on the gaps and so is its ratio to old."""
    logp_bt = torch.tensor([[50.0, -50.0, -1.0, -2.0, 80.0, -80.0, -1.5, -0.5, -1.0]])
    old_bt = logp_bt - gap_log_ratio
    old_bt[0, MODEL] = logp_bt[0, MODEL] - torch.tensor(model_log_ratio)
    adv_bt = torch.tensor([[-7.0, -7.0, 1.0, 1.0, -7.0, -7.0, 1.0, 1.0, 1.0]])
    return logp_bt.requires_grad_(), old_bt, adv_bt


def test_gspo_sequence_ratio_averages_model_tokens_only():
    cfg = PolicyLossConfig(name="gspo", agg="seq-mean-token-mean")
    logp_bt, old_bt, adv_bt = _gspo_gapped([0.1, 0.2, -0.1, 0.0, 0.3], gap_log_ratio=5.0)
    loss, m = gspo_loss(logp_bt, old_bt, adv_bt, _mask_bt(), cfg, LossNorm(5, 1))
    # log s = (0.1 + 0.2 - 0.1 + 0 + 0.3) / 5 = 0.1 -> s = 1.105171, inside [0.8, 1.2]
    # (with the four gap tokens: (0.5 + 20) / 9 = 2.28 -> s = 9.8, clipped)
    # loss = mean over the 5 model tokens of -A s = -1.105171
    torch.testing.assert_close(loss, torch.tensor(-math.exp(0.1)))
    assert m["actor/ratio_mean"] == pytest.approx(math.exp(0.1))
    assert m["actor/ppo_kl"] == pytest.approx(-0.1)  # mean of old - new over model tokens
    assert m["actor/pg_clipfrac"] == 0.0
    loss.backward()
    assert logp_bt.grad is not None
    # d/dlogp_t = -A s / n = -1.105171 / 5 = -0.221034 on model tokens, 0 under the gaps
    torch.testing.assert_close(logp_bt.grad, -_mask_bt() * math.exp(0.1) / 5)


def test_gspo_clips_on_the_model_tokens_ratio_not_the_gaps():
    cfg = PolicyLossConfig(name="gspo", agg="seq-mean-token-mean")
    # model tokens: log s = 0.3 -> s = 1.3499 > 1.2 with A = 1: clipped, loss -1.2, no gradient
    # (counting the gaps, (5 * 0.3 - 4 * 0.375) / 9 = 0 would leave it unclipped)
    logp_bt, old_bt, adv_bt = _gspo_gapped([0.3] * 5, gap_log_ratio=-0.375)
    loss, m = gspo_loss(logp_bt, old_bt, adv_bt, _mask_bt(), cfg, LossNorm(5, 1))
    torch.testing.assert_close(loss, torch.tensor(-1.2))
    assert m["actor/pg_clipfrac"] == 1.0
    loss.backward()
    assert logp_bt.grad is not None and logp_bt.grad.eq(0).all()


def test_kl_reward_penalty_sums_model_tokens_only():
    mask_bt = _masks(MASK)
    logp_bt = _gapped([[-1.0, -2.0, -1.5, -0.5, -1.0]], mask_bt, garbage=40.0)
    ref_bt = _gapped([[-1.5, -2.0, -1.0, -1.0, -1.25]], mask_bt, garbage=-40.0)
    token_rewards_bt, scores_b, kl_b = kl_reward_penalty(
        torch.tensor([2.0]), logp_bt, ref_bt, mask_bt, coef=0.1, kind="k1"
    )
    # k1 = logp - ref on model tokens: 0.5, 0, -0.5, 0.5, 0.25 ; sum 0.75 ; gaps add nothing
    torch.testing.assert_close(kl_b, torch.tensor([0.75]))
    torch.testing.assert_close(scores_b, torch.tensor([2.0 - 0.075]))
    # score 2 on the last model token (t8), -0.1 * k1 on each model token, 0 on env tokens
    expected = [0.0, 0.0, -0.05, 0.0, 0.0, 0.0, 0.05, -0.05, 2.0 - 0.025]
    torch.testing.assert_close(token_rewards_bt, torch.tensor([expected]))


@pytest.mark.parametrize("agg", sorted(AGGREGATIONS))
@pytest.mark.parametrize("loss_name", sorted(POLICY_LOSSES))
def test_policy_objective_equals_the_gapless_layout(loss_name, agg):
    """The whole policy objective the engines minimise (policy loss, entropy bonus, KL to
    the reference, truncated importance weight against rollout log-probs that are 0.0 on
    environment tokens, as the episode loop writes them): same loss, gradient and metrics
    as on the gapless layout, and no gradient under a gap."""
    mask_bt = _masks(MASK, MASK2, MASK3)
    gen = torch.Generator().manual_seed(0)

    def model_rows(scale: float, shift: float) -> list[list[float]]:
        return [
            (shift + scale * torch.randn(int(n), generator=gen)).tolist() for n in mask_bt.sum(-1)
        ]

    logp_bt = _gapped(model_rows(0.3, -1.0), mask_bt, garbage=30.0)
    old_bt = logp_bt + _gapped(model_rows(0.3, 0.0), mask_bt, garbage=-60.0)
    old_bt[0] += 0.3  # sample 0's sequence ratio ~ e^-0.3 < 0.8: gspo clips it too
    ref_bt = logp_bt + _gapped(model_rows(0.2, 0.0), mask_bt, garbage=-50.0)
    rollout_bt = (old_bt + _gapped(model_rows(0.3, 0.0), mask_bt, garbage=0.0)) * mask_bt
    entropy_bt = _gapped(model_rows(0.2, 1.0), mask_bt, garbage=70.0)
    adv_bt = _gapped(model_rows(1.0, 0.0), mask_bt, garbage=90.0)
    loss_cfg = PolicyLossConfig(name=loss_name, agg=agg, clip_c=3.0)
    reg = RegularizerConfig(kl_coef=0.05, kl_type="k3", entropy_coef=0.01)
    norm = LossNorm(global_tokens=13, global_samples=3, norm_const=16.0)

    def objective(mask: torch.Tensor, tensors: list[torch.Tensor]):
        logp, old, ref, rollout, entropy, adv = tensors
        logp, entropy = logp.clone().requires_grad_(), entropy.clone().requires_grad_()
        batch = TrajectoryBatch(
            input_ids_bt=torch.zeros(mask.shape, dtype=torch.long),
            attention_mask_bt=torch.ones(mask.shape, dtype=torch.long),
            response_mask_bt=mask.long(),
            rollout_logp_bt=rollout, ref_logp_bt=ref, advantages_bt=adv,
        )  # fmt: skip
        loss, metrics = policy_objective(logp, entropy, old, batch, loss_cfg, reg, norm, 1.1)
        loss.backward()
        assert logp.grad is not None and entropy.grad is not None
        return loss, metrics, logp.grad, entropy.grad

    tensors = [logp_bt, old_bt, ref_bt, rollout_bt, entropy_bt, adv_bt]
    loss, metrics, logp_grad_bt, ent_grad_bt = objective(mask_bt, tensors)
    compact = [_compact(x, mask_bt)[0] for x in tensors]
    ref_loss, ref_metrics, ref_logp_grad_bt, ref_ent_grad_bt = objective(
        _compact(mask_bt, mask_bt)[1], compact
    )
    torch.testing.assert_close(loss, ref_loss)
    assert _floats(metrics) == pytest.approx(_floats(ref_metrics), rel=1e-5, abs=1e-7)
    # the clip and the importance-weight cap are exercised on some model tokens
    assert 0 < metrics["rollout/is_capped_frac"] < 1
    if loss_name not in ("sapo", "kl_cov"):  # these two have no clip
        assert 0 < metrics["actor/pg_clipfrac"] < 1
    assert logp_grad_bt[mask_bt == 0].eq(0).all() and ent_grad_bt[mask_bt == 0].eq(0).all()
    torch.testing.assert_close(logp_grad_bt, _spread(ref_logp_grad_bt, mask_bt))
    torch.testing.assert_close(ent_grad_bt, _spread(ref_ent_grad_bt, mask_bt))


def test_value_and_sft_losses_equal_the_gapless_layout():
    mask_bt = _masks(MASK, MASK2)
    model = [[0.2, 0.3, 0.4, 0.5, 0.6], [0.1, -0.2, 0.3, 0.0, 0.7]]
    values_bt = _gapped(model, mask_bt, garbage=9.0).requires_grad_()
    # old values 0.8 away from the new ones on some tokens: the 0.5 clip range is exercised
    shift = [[0.8, 0.0, -0.8, 0.0, 0.3], [0.0, 0.8, 0.0, -0.8, 0.0]]
    old_bt = values_bt.detach() + _gapped(shift, mask_bt, garbage=-20.0)
    returns_bt = _gapped([[1.0] * 5, [0.0] * 5], mask_bt, garbage=-9.0)
    norm = LossNorm(global_tokens=10, global_samples=2, norm_const=16.0)
    for agg in sorted(AGGREGATIONS):
        values_bt.grad = None
        loss, m = clipped_value_loss(
            values_bt, old_bt, returns_bt, mask_bt, clip=0.5, agg=agg, norm=norm
        )
        compact_values_bt, compact_mask_bt = _compact(values_bt.detach(), mask_bt)
        compact_values_bt.requires_grad_()
        ref, ref_m = clipped_value_loss(
            compact_values_bt, _compact(old_bt, mask_bt)[0], _compact(returns_bt, mask_bt)[0],
            compact_mask_bt, clip=0.5, agg=agg, norm=norm,
        )  # fmt: skip
        torch.testing.assert_close(loss, ref)
        assert _floats(m) == pytest.approx(_floats(ref_m)) and 0 < m["critic/vf_clipfrac"] < 1
        (loss + ref).backward()
        assert values_bt.grad is not None and compact_values_bt.grad is not None
        torch.testing.assert_close(values_bt.grad, _spread(compact_values_bt.grad, mask_bt))
    # sft on the model tokens of an episode: -(-1 - 2 - 1.5 - 0.5 - 1) / 5 = 1.2 per token
    logp_bt = _gapped([[-1.0, -2.0, -1.5, -0.5, -1.0]], _masks(MASK), garbage=-1e3)
    loss, m = sft_loss(logp_bt, _masks(MASK), LossNorm(global_tokens=5, global_samples=1))
    torch.testing.assert_close(loss, torch.tensor(1.2))
    assert m["sft/nll"] == pytest.approx(1.2)
