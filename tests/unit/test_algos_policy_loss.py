# Shapes: b = samples, t = tokens.
import math

import pytest
import torch

from rlpost.algos import (
    POLICY_LOSSES,
    LossNorm,
    PolicyLossConfig,
    build_policy_loss,
    gspo_loss,
    ppo_clip_loss,
    register_policy_loss,
    sft_loss,
)

E = math.e


def _ppo_case():
    # one sample, four tokens; the last is not a response token
    old_bt = torch.zeros(1, 4)
    logp_bt = torch.tensor([[0.1, 0.5, -0.5, 0.3]], requires_grad=True)
    adv_bt = torch.tensor([[1.0, 1.0, -1.0, 1.0]])
    mask_bt = torch.tensor([[1, 1, 1, 0]])
    return logp_bt, old_bt, adv_bt, mask_bt


def test_ppo_clip_hand_values_and_gradient():
    logp_bt, old_bt, adv_bt, mask_bt = _ppo_case()
    loss, m = ppo_clip_loss(logp_bt, old_bt, adv_bt, mask_bt, PolicyLossConfig(), LossNorm(3, 1))
    # t0: r = e^0.1 = 1.10517 inside [0.8, 1.2] -> pg = -1.10517
    # t1: r = e^0.5 = 1.64872, A>0 -> max(-1.64872, -1.2) = -1.2 (clipped)
    # t2: r = e^-0.5 = 0.60653, A<0 -> max(0.60653, 0.8) = 0.8 (clipped)
    # loss = (-1.10517 - 1.2 + 0.8) / 3 = -0.501723
    assert loss.item() == pytest.approx((-(E**0.1) - 1.2 + 0.8) / 3, abs=1e-6)
    assert m["actor/pg_clipfrac"] == pytest.approx(2 / 3)  # t1, t2 clipped
    assert m["actor/ppo_kl"] == pytest.approx(-0.1 / 3)  # mean(old - new) = -(0.1 + 0.5 - 0.5) / 3
    assert m["actor/ratio_mean"] == pytest.approx((E**0.1 + E**0.5 + E**-0.5) / 3)  # 1.120140
    assert m["actor/pg_clipfrac_lower"] == 0.0  # dual clip off
    assert m["actor/pg_loss"] == pytest.approx(loss.item())
    loss.backward()
    # d/dlogp_t0 = -A r / 3 = -1.10517 / 3 = -0.368390; clipped and masked tokens get 0
    torch.testing.assert_close(logp_bt.grad, torch.tensor([[-(E**0.1) / 3, 0.0, 0.0, 0.0]]))


def test_clip_higher_raises_only_the_upper_bound():
    logp_bt, old_bt, adv_bt, mask_bt = _ppo_case()
    cfg = PolicyLossConfig(clip_low=0.2, clip_high=0.28)
    loss, _ = ppo_clip_loss(logp_bt, old_bt, adv_bt, mask_bt, cfg, LossNorm(3, 1))
    # t1 now clipped at 1.28: (-1.10517 - 1.28 + 0.8) / 3 = -0.528390 ; t2 still at 0.8
    assert loss.item() == pytest.approx((-(E**0.1) - 1.28 + 0.8) / 3, abs=1e-6)


def test_dual_clip_bounds_negative_advantage_loss():
    logp_bt = torch.tensor([[1.5, 1.5]], requires_grad=True)
    old_bt, mask_bt = torch.zeros(1, 2), torch.ones(1, 2)
    adv_bt = torch.tensor([[-1.0, 1.0]])
    cfg = PolicyLossConfig(clip_c=3.0)
    loss, m = ppo_clip_loss(logp_bt, old_bt, adv_bt, mask_bt, cfg, LossNorm(2, 1))
    # t0: r = e^1.5 = 4.48169, A=-1: max(4.48169, 1.2) = 4.48169 -> min(4.48169, 3 * 1) = 3
    # t1: A=+1: max(-4.48169, -1.2) = -1.2 ; dual clip does not apply to A > 0
    assert loss.item() == pytest.approx((3.0 - 1.2) / 2)
    assert m["actor/pg_clipfrac_lower"] == pytest.approx(0.5)  # t0 only
    loss.backward()
    torch.testing.assert_close(logp_bt.grad, torch.zeros(1, 2))  # both flat
    # without dual clip, t0 keeps loss 4.48169 and gradient -A r / 2 = 2.240845
    loss, _ = ppo_clip_loss(logp_bt, old_bt, adv_bt, mask_bt, PolicyLossConfig(), LossNorm(2, 1))
    assert loss.item() == pytest.approx((E**1.5 - 1.2) / 2, abs=1e-5)


def test_log_ratio_clamp_keeps_loss_finite():
    logp_bt, old_bt = torch.tensor([[80.0]]), torch.zeros(1, 1)
    adv_bt, mask_bt = -torch.ones(1, 1), torch.ones(1, 1)
    loss, _ = ppo_clip_loss(logp_bt, old_bt, adv_bt, mask_bt, PolicyLossConfig(), LossNorm(1, 1))
    assert loss.item() == pytest.approx(E**20, rel=1e-5)  # e^80 overflows fp32; e^20 = 4.85e8


def _naive_ppo(logp, old, adv, mask, cfg):
    """Per-token loop on Python floats, token-mean over the tensor's own tokens."""
    total, n = 0.0, 0
    for i in range(len(logp)):
        for j in range(len(logp[i])):
            if not mask[i][j]:
                continue
            r = math.exp(logp[i][j] - old[i][j])
            a = adv[i][j]
            pg = max(-a * r, -a * min(max(r, 1 - cfg.clip_low), 1 + cfg.clip_high))
            if cfg.clip_c is not None and a < 0:
                pg = min(pg, -a * cfg.clip_c)
            total, n = total + pg, n + 1
    return total / n


def test_ppo_clip_matches_naive_loop():
    gen = torch.Generator().manual_seed(1)
    old_bt = torch.randn(4, 6, generator=gen)
    logp_bt = old_bt + 0.8 * torch.randn(4, 6, generator=gen)
    adv_bt = torch.randn(4, 6, generator=gen)
    mask_bt = (torch.rand(4, 6, generator=gen) > 0.25).long()
    cfg = PolicyLossConfig(clip_low=0.2, clip_high=0.3, clip_c=2.0)
    loss, _ = ppo_clip_loss(logp_bt, old_bt, adv_bt, mask_bt, cfg, LossNorm(mask_bt.sum(), 4))
    ref = _naive_ppo(logp_bt.tolist(), old_bt.tolist(), adv_bt.tolist(), mask_bt.tolist(), cfg)
    assert loss.item() == pytest.approx(ref, rel=1e-5)


def _gspo_case(d0, d1):
    old_bt = torch.zeros(2, 3)
    logp_bt = torch.tensor([d0, d1], requires_grad=True)
    adv_bt = torch.tensor([[1.0] * 3, [-1.0] * 3])
    mask_bt = torch.tensor([[1, 1, 0], [1, 1, 1]])
    return logp_bt, old_bt, adv_bt, mask_bt


def test_gspo_uses_the_sequence_ratio_and_its_gradient():
    logp_bt, old_bt, adv_bt, mask_bt = _gspo_case([0.2, 0.0, 9.0], [-0.3, -0.1, -0.2])
    cfg = PolicyLossConfig(name="gspo", agg="seq-mean-token-mean")
    loss, m = gspo_loss(logp_bt, old_bt, adv_bt, mask_bt, cfg, LossNorm(5, 2))
    # s_0 = e^((0.2 + 0)/2) = e^0.1 = 1.105171 ; s_1 = e^((-0.3 - 0.1 - 0.2)/3) = e^-0.2 = 0.818731
    # both inside [0.8, 1.2]: loss = (-1.105171 + 0.818731) / 2 = -0.143220
    assert loss.item() == pytest.approx((-(E**0.1) + E**-0.2) / 2, abs=1e-6)
    # every token carries its sequence's ratio: (2 * 1.105171 + 3 * 0.818731) / 5 = 0.933307
    assert m["actor/ratio_mean"] == pytest.approx((2 * E**0.1 + 3 * E**-0.2) / 5, abs=1e-6)
    loss.backward()
    # d/dlogp_t = -A_i s_i / (n_i * B): -1.105171 / 4 = -0.276293 ; +0.818731 / 6 = 0.136455
    expected = torch.tensor([[-(E**0.1) / 4] * 2 + [0.0], [E**-0.2 / 6] * 3])
    torch.testing.assert_close(logp_bt.grad, expected)

    # independent reference: the sequence-level objective written directly, -mean_i A_i s_i
    ref_bt = logp_bt.detach().clone().requires_grad_()
    m_bt = mask_bt.float()
    s_b = torch.exp((ref_bt * m_bt).sum(-1) / m_bt.sum(-1))
    (-(adv_bt[:, 0] * s_b).mean()).backward()
    torch.testing.assert_close(logp_bt.grad, ref_bt.grad)


def test_gspo_clips_whole_sequences():
    logp_bt, old_bt, adv_bt, mask_bt = _gspo_case([0.5, 0.5, 0.0], [0.0, 0.0, 0.0])
    cfg = PolicyLossConfig(name="gspo", agg="seq-mean-token-mean")
    loss, m = gspo_loss(logp_bt, old_bt, adv_bt, mask_bt, cfg, LossNorm(5, 2))
    # s_0 = e^0.5 = 1.6487 > 1.2 with A>0 -> -1.2 ; s_1 = 1 -> +1 ; loss = (-1.2 + 1) / 2 = -0.1
    assert loss.item() == pytest.approx(-0.1)
    assert m["actor/pg_clipfrac"] == pytest.approx(2 / 5)  # both tokens of sample 0
    loss.backward()
    assert logp_bt.grad[0].abs().sum().item() == 0.0  # clipped sequence has no gradient


def test_sft_loss_divides_by_global_tokens():
    logp_bt = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -9.0, -9.0]])
    mask_bt = torch.tensor([[1, 1, 0], [1, 0, 0]])
    loss, m = sft_loss(logp_bt, mask_bt, LossNorm(global_tokens=7, global_samples=5))
    assert loss.item() == pytest.approx(0.5)  # (1 + 2 + 0.5) / 7 global tokens
    assert m["sft/nll"] == pytest.approx(3.5 / 3)  # this micro-batch: 3.5 / 3 = 1.166667


def test_sft_loss_matches_cross_entropy():
    gen = torch.Generator().manual_seed(2)
    logits_btv = torch.randn(2, 4, 7, generator=gen)
    targets_bt = torch.randint(0, 7, (2, 4), generator=gen)
    logp_bt = torch.log_softmax(logits_btv, -1).gather(-1, targets_bt[..., None])[..., 0]
    loss, _ = sft_loss(logp_bt, torch.ones(2, 4), LossNorm(8, 2))
    ref = torch.nn.functional.cross_entropy(logits_btv.reshape(8, 7), targets_bt.reshape(8))
    torch.testing.assert_close(loss, ref)


def test_policy_loss_registry():
    assert build_policy_loss(PolicyLossConfig(name="gspo")) is gspo_loss
    assert build_policy_loss(PolicyLossConfig()) is ppo_clip_loss
    with pytest.raises(KeyError, match="ppo_clip"):
        build_policy_loss(PolicyLossConfig(name="nope"))
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("ppo_clip")(ppo_clip_loss)
    try:
        register_policy_loss("mine")(ppo_clip_loss)
        assert build_policy_loss(PolicyLossConfig(name="mine")) is ppo_clip_loss
    finally:
        POLICY_LOSSES.pop("mine", None)
