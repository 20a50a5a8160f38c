# Shapes: b = samples, t = tokens, v = vocab.
import math

import pytest
import torch

from rlpost.algos import (
    AdaptiveKLController,
    FixedKLController,
    LossNorm,
    clipped_value_loss,
    entropy_from_logits,
    explained_variance,
    kl_penalty,
)

LOGP_BT = torch.tensor([[0.0, -1.0, -2.0]])
REF_BT = torch.tensor([[-0.5, -0.5, -2.0]])  # d = logp - ref = [0.5, -0.5, 0]


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("k1", [0.5, -0.5, 0.0]),
        ("k2", [0.125, 0.125, 0.0]),  # 0.5 * 0.25
        ("k3", [math.exp(-0.5) - 0.5, math.exp(0.5) - 1.5, 0.0]),  # 0.106531, 0.148721, 0
        ("abs", [0.5, 0.5, 0.0]),
    ],
)
def test_kl_penalty_hand_values(kind, expected):
    torch.testing.assert_close(kl_penalty(LOGP_BT, REF_BT, kind), torch.tensor([expected]))


def test_k3_expectation_is_the_exact_kl():
    # E_{x~p}[exp(-d) + d - 1] = sum_x q - 1 + KL(p||q) = KL(p||q) for full distributions
    gen = torch.Generator().manual_seed(5)
    logp_v = torch.log_softmax(torch.randn(11, generator=gen), -1)
    logq_v = torch.log_softmax(torch.randn(11, generator=gen), -1)
    k3 = (logp_v.exp() * kl_penalty(logp_v, logq_v, "k3")).sum()
    exact = torch.nn.functional.kl_div(logq_v, logp_v, log_target=True, reduction="sum")
    torch.testing.assert_close(k3, exact)


def test_kl_penalty_unknown_kind():
    with pytest.raises(KeyError, match="k3"):
        kl_penalty(LOGP_BT, REF_BT, "low_var")


def test_adaptive_kl_controller():
    ctl = AdaptiveKLController(init_coef=0.1, target=6.0, horizon=10000)
    ctl.update(current_kl=9.0, n_steps=1000)
    # error = clip(9/6 - 1 = 0.5, +-0.2) = 0.2 ; beta = 0.1 * (1 + 0.2 * 1000/10000) = 0.102
    assert ctl.value == pytest.approx(0.102)
    ctl.update(current_kl=5.7, n_steps=1000)
    # error = 5.7/6 - 1 = -0.05 ; beta = 0.102 * (1 - 0.005) = 0.10149
    assert ctl.value == pytest.approx(0.10149)


def test_fixed_kl_controller():
    ctl = FixedKLController(0.05)
    ctl.update(current_kl=100.0, n_steps=10)
    assert ctl.value == 0.05


def test_entropy_hand_values_and_stability():
    # -1e4 logits have probability e^-1e4 = 0 in fp32
    logits_btv = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3), -1e4, -1e4]]])
    # uniform over 4: ln 4 = 1.386294 ; p = [1/4, 3/4]: 0.25 ln 4 + 0.75 ln(4/3) = 0.562335
    expected_bt = torch.tensor([[math.log(4), 0.25 * math.log(4) + 0.75 * math.log(4 / 3)]])
    torch.testing.assert_close(entropy_from_logits(logits_btv), expected_bt)
    # shifting every logit by 1e4 leaves the distribution alone; logsumexp stays finite
    # (fp32 spacing near 1e4 is 1e-3, hence the tolerance)
    torch.testing.assert_close(
        entropy_from_logits(logits_btv + 1e4), expected_bt, atol=2e-3, rtol=0
    )


def test_entropy_matches_categorical():
    logits_btv = torch.randn(2, 3, 17, generator=torch.Generator().manual_seed(6))
    ref_bt = torch.distributions.Categorical(logits=logits_btv).entropy()
    torch.testing.assert_close(entropy_from_logits(logits_btv), ref_bt)


def test_clipped_value_loss_hand_values():
    values_bt = torch.tensor([[1.0, 2.0, 0.9, 7.0]], requires_grad=True)
    old_bt = torch.tensor([[0.8, 1.0, 0.0, 0.0]])
    returns_bt = torch.tensor([[1.5, 1.0, 1.0, 0.0]])
    mask_bt = torch.tensor([[1, 1, 1, 0]])
    loss, m = clipped_value_loss(
        values_bt, old_bt, returns_bt, mask_bt, clip=0.2, agg="token-mean", norm=LossNorm(3, 1)
    )
    # t0: clip(1.0, 0.6..1.0) = 1.0 ; (1-1.5)^2 = 0.25 both -> 0.125
    # t1: clip(2.0, 0.8..1.2) = 1.2 ; max((2-1)^2, (1.2-1)^2) = 1 -> 0.5
    # t2: clip(0.9, -0.2..0.2) = 0.2 ; max((0.9-1)^2 = 0.01, (0.2-1)^2 = 0.64) -> 0.32 (clipped)
    # loss = (0.125 + 0.5 + 0.32) / 3 = 0.315
    assert loss.item() == pytest.approx(0.315)
    assert m["critic/vf_loss"] == pytest.approx(0.315)
    assert m["critic/vf_clipfrac"] == pytest.approx(1 / 3)
    loss.backward()
    # t1: (v - R) / 3 = 1/3 ; t2 sits on the clip bound -> 0 ; t3 masked -> 0
    assert values_bt.grad[0, 1:].tolist() == pytest.approx([1 / 3, 0.0, 0.0])


def test_explained_variance():
    returns_bt = torch.tensor([[1.0, 2.0, 3.0, 4.0, 0.0]])
    values_bt = torch.tensor([[1.0, 2.0, 3.0, 5.0, 99.0]])
    mask_bt = torch.tensor([[1, 1, 1, 1, 0]])
    # residual [0, 0, 0, -1]: var = 0.1875 ; var(R) = 5 / 4 = 1.25 ; 1 - 0.1875 / 1.25 = 0.85
    assert explained_variance(values_bt, returns_bt, mask_bt) == pytest.approx(0.85)
    assert math.isnan(explained_variance(values_bt, torch.ones(1, 5), mask_bt))
