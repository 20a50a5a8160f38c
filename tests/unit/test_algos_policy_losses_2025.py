# Shapes: b = samples, t = tokens.
# Hand-computed values for the 2025 policy losses (cispo, sapo, geo_mean/gmpo, clip_cov,
# kl_cov): the loss, its gradient d loss / d logp, and an independent reference each.
import math

import pytest
import torch

from rlpost.algos import (
    POLICY_LOSSES,
    LossNorm,
    PolicyLossConfig,
    build_policy_loss,
    cispo_loss,
    clip_cov_loss,
    gmpo_loss,
    kl_cov_loss,
    ppo_clip_loss,
    sapo_loss,
    token_covariance,
)

E = math.e


def _sig(x):
    return 1 / (1 + math.exp(-x))


def _case():
    # two samples, three tokens; sample 1's last token is not a response token
    # log-ratios logp - old: sample 0 [0.1, 0.5, -0.5], sample 1 [-0.6, 0.3, (0)]
    old_bt = torch.tensor([[-1.1, -1.0, -1.5], [-0.9, -0.5, -3.0]])
    logp_bt = torch.tensor([[-1.0, -0.5, -2.0], [-1.5, -0.2, -3.0]], requires_grad=True)
    adv_bt = torch.tensor([[1.0] * 3, [-1.0] * 3])
    mask_bt = torch.tensor([[1, 1, 1], [1, 1, 0]])
    return logp_bt, old_bt, adv_bt, mask_bt


NORM = LossNorm(global_tokens=5, global_samples=2)


# --- cispo ----------------------------------------------------------------------------


def test_cispo_hand_values_and_gradient():
    logp_bt, old_bt, adv_bt, mask_bt = _case()
    cfg = PolicyLossConfig(name="cispo", clip_low=1.0, clip_high=0.28)  # no lower bound
    loss, m = cispo_loss(logp_bt, old_bt, adv_bt, mask_bt, cfg, NORM)
    # weights w = sg(clip(r, 0, 1.28)):
    #   s0: e^0.1 = 1.105171, e^0.5 = 1.648721 -> 1.28, e^-0.5 = 0.606531 (no lower bound)
    #   s1: e^-0.6 = 0.548812, e^0.3 = 1.349859 -> 1.28
    # terms -w A logp: 1.105171*1.0 + 1.28*0.5 + 0.606531*2.0 = 2.958232 (s0, A = +1)
    #                  -(0.548812*1.5 + 1.28*0.2) = -1.079218 (s1, A = -1)
    # token-mean: (2.958232 - 1.079218) / 5 = 0.375803
    s0 = E**0.1 * 1.0 + 1.28 * 0.5 + E**-0.5 * 2.0
    s1 = -(E**-0.6 * 1.5 + 1.28 * 0.2)
    assert loss.item() == pytest.approx((s0 + s1) / 5, abs=1e-6)
    assert m["actor/pg_clipfrac"] == pytest.approx(2 / 5)  # s0t1 and s1t1 above 1.28
    assert m["actor/pg_clipfrac_lower"] == 0.0
    assert m["actor/ppo_kl"] == pytest.approx(-(0.1 + 0.5 - 0.5 - 0.6 + 0.3) / 5, abs=1e-6)
    loss.backward()
    # d/dlogp = -w A / 5: every response token keeps a gradient, the clipped ones too
    # s0: -1.105171/5 = -0.221034, -1.28/5 = -0.256, -0.606531/5 = -0.121306
    # s1: +0.548812/5 = 0.109762, +1.28/5 = 0.256, masked 0
    expected = torch.tensor([[-(E**0.1), -1.28, -(E**-0.5)], [E**-0.6, 1.28, 0.0]]) / 5
    torch.testing.assert_close(logp_bt.grad, expected)


def test_cispo_lower_bound_and_its_metric():
    logp_bt, old_bt, adv_bt, mask_bt = _case()
    cfg = PolicyLossConfig(name="cispo", clip_low=0.2, clip_high=0.28)
    loss, m = cispo_loss(logp_bt, old_bt, adv_bt, mask_bt, cfg, NORM)
    # now s0t2 (0.606531) and s1t0 (0.548812) are lifted to 0.8:
    # (1.105171*1.0 + 1.28*0.5 + 0.8*2.0 - 0.8*1.5 - 1.28*0.2) / 5 = 0.377834
    expected = (E**0.1 + 1.28 * 0.5 + 0.8 * 2.0 - 0.8 * 1.5 - 1.28 * 0.2) / 5
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert m["actor/pg_clipfrac_lower"] == pytest.approx(2 / 5)


# --- sapo -----------------------------------------------------------------------------


def test_sapo_hand_values_and_gradient():
    logp_bt, old_bt, adv_bt, mask_bt = _case()
    cfg = PolicyLossConfig(name="sapo", agg="seq-mean-token-mean")  # tau_pos 1, tau_neg 1.05
    loss, m = sapo_loss(logp_bt, old_bt, adv_bt, mask_bt, cfg, NORM)
    # f(r, tau) = sigmoid(tau (r - 1)) * 4 / tau ; s0 has A > 0 -> tau 1, s1 A < 0 -> tau 1.05
    # s0: r = 1.105171 -> sig(0.105171) = 0.526269 -> f = 2.105074
    #     r = 1.648721 -> sig(0.648721) = 0.656722 -> f = 2.626889
    #     r = 0.606531 -> sig(-0.393469) = 0.402882 -> f = 1.611530
    # s1: r = 0.548812 -> sig(1.05 * -0.451188 = -0.473748) = 0.383730 -> f = 1.461827
    #     r = 1.349859 -> sig(1.05 * 0.349859 = 0.367352) = 0.590819 -> f = 2.250739
    # seq-mean-token-mean of -f A: s0 -(2.105074 + 2.626889 + 1.611530) / 3 = -2.114498
    #                              s1 (1.461827 + 2.250739) / 2 = 1.856283 ; loss -0.129107
    r = [[E**0.1, E**0.5, E**-0.5], [E**-0.6, E**0.3]]
    f0 = [4 * _sig(x - 1) for x in r[0]]
    f1 = [4 / 1.05 * _sig(1.05 * (x - 1)) for x in r[1]]
    assert f0[0] == pytest.approx(2.105074, abs=1e-6)
    assert loss.item() == pytest.approx((-sum(f0) / 3 + sum(f1) / 2) / 2, abs=1e-6)
    assert loss.item() == pytest.approx(-0.129107, abs=1e-6)
    assert m["actor/pg_clipfrac"] == 0.0
    assert m["actor/gate_mean"] == pytest.approx((sum(f0) + sum(f1)) / 5, abs=1e-6)
    loss.backward()

    # d f / d logp = 4 sig (1 - sig) r ; d loss / d logp_t = -A * that / (n_i * 2)
    # s0: -1.102120/6 = -0.183687, -1.486739/6 = -0.247790, -0.583648/6 = -0.097275
    # s1: +0.519135/4 = 0.129784, +1.305324/4 = 0.326331
    def g(x, tau):
        s = _sig(tau * (x - 1))
        return 4 * s * (1 - s) * x

    expected = torch.tensor(
        [[-g(x, 1.0) / 6 for x in r[0]], [g(x, 1.05) / 4 for x in r[1]] + [0.0]]
    )
    torch.testing.assert_close(logp_bt.grad, expected)
    assert logp_bt.grad[0, 0].item() == pytest.approx(-0.183687, abs=1e-6)


# --- geo_mean (gmpo) ------------------------------------------------------------------


def test_gmpo_hand_values_and_gradient():
    logp_bt, old_bt, adv_bt, mask_bt = _case()
    cfg = PolicyLossConfig(name="geo_mean", clip_low=0.4, clip_high=0.4, agg="seq-mean-token-mean")
    loss, m = gmpo_loss(logp_bt, old_bt, adv_bt, mask_bt, cfg, NORM)
    # log-ratios clipped pessimistically to [-0.4, 0.4]:
    # s0 (A > 0, only the top is cut): [0.1, 0.5 -> 0.4, -0.5] -> mean 0 -> s_0 = e^0 = 1
    # s1 (A < 0, only the bottom is cut): [-0.6 -> -0.4, 0.3] -> mean -0.05 -> s_1 = 0.951229
    # pg = -A s: -1 and +0.951229 ; mean over the 2 sequences: -0.024385
    assert loss.item() == pytest.approx((-1 + E**-0.05) / 2, abs=1e-6)
    assert m["actor/pg_clipfrac"] == pytest.approx(2 / 5)  # s0t1, s1t0
    assert m["actor/ratio_mean"] == pytest.approx((3 * 1 + 2 * E**-0.05) / 5, abs=1e-6)
    loss.backward()
    # d pg_i / d logp_t = -A_i s_i / n_i on unclipped tokens, / 2 sequences:
    # s0: -1/6 = -0.166667 at t0, t2 ; s1: +0.951229/4 = 0.237807 at t1 ; clipped -> 0
    expected = torch.tensor([[-1 / 6, 0.0, -1 / 6], [0.0, E**-0.05 / 4, 0.0]])
    torch.testing.assert_close(logp_bt.grad, expected)

    # independent reference: the geometric mean of the clipped token ratios as a product
    ref_bt = logp_bt.detach().clone().requires_grad_()
    x_bt = ref_bt - old_bt
    hi_bt = torch.where(x_bt > 0.4, x_bt.detach() * 0 + 0.4, x_bt)  # A > 0: cut the top
    lo_bt = torch.where(x_bt < -0.4, x_bt.detach() * 0 - 0.4, x_bt)  # A < 0: cut the bottom
    s0 = torch.prod(torch.exp(hi_bt[0])) ** (1 / 3)
    s1 = torch.prod(torch.exp(lo_bt[1, :2])) ** (1 / 2)
    ((-s0 + s1) / 2).backward()
    torch.testing.assert_close(logp_bt.grad, ref_bt.grad)


def test_gmpo_is_registered_under_both_names():
    assert POLICY_LOSSES["gmpo"] is POLICY_LOSSES["geo_mean"] is gmpo_loss


# --- clip_cov / kl_cov ----------------------------------------------------------------


def _cov_case():
    # small log-ratios, so the PPO clip (0.8, 1.2) is inactive everywhere:
    # logp - old = [[0.1, 0, -0.1], [0.05, 0, (0)]]
    logp_bt = torch.tensor([[-0.5, -2.5, -1.0], [-3.0, -0.5, -9.0]], requires_grad=True)
    old_bt = logp_bt.detach() - torch.tensor([[0.1, 0.0, -0.1], [0.05, 0.0, 0.0]])
    adv_bt = torch.tensor([[2.0] * 3, [-1.0] * 3])
    mask_bt = torch.tensor([[1, 1, 1], [1, 1, 0]])
    return logp_bt, old_bt, adv_bt, mask_bt


def test_token_covariance_hand_values():
    logp_bt, _, adv_bt, mask_bt = _cov_case()
    cov_bt = token_covariance(logp_bt, adv_bt, mask_bt)
    # mean A = (3 * 2 - 2) / 5 = 0.8 ; mean logp = (-0.5 - 2.5 - 1 - 3 - 0.5) / 5 = -1.5
    # s0: (2 - 0.8) * [1.0, -1.0, 0.5] = [1.2, -1.2, 0.6]
    # s1: (-1 - 0.8) * [-1.5, 1.0] = [2.7, -1.8] ; the padding token -inf
    expected = torch.tensor([[1.2, -1.2, 0.6], [2.7, -1.8, -math.inf]])
    torch.testing.assert_close(cov_bt, expected)
    assert not cov_bt.requires_grad


def test_clip_cov_drops_the_top_covariance_token_in_the_band():
    logp_bt, old_bt, adv_bt, mask_bt = _cov_case()
    cfg = PolicyLossConfig(name="clip_cov")  # ratio 2e-4, band (1, 5)
    loss, m = clip_cov_loss(logp_bt, old_bt, adv_bt, mask_bt, cfg, NORM)
    # band (1, 5): s0t0 (1.2) and s1t0 (2.7); k = max(int(2e-4 * 5), 1) = 1 -> s1t0 dropped
    # pg = -A r: s0 -2 e^0.1 = -2.210342, -2, -2 e^-0.1 = -1.809675 ; s1t0 0 (dropped), s1t1 +1
    # token-mean: (-2.210342 - 2 - 1.809675 + 1) / 5 = -1.004003
    assert loss.item() == pytest.approx((-2 * E**0.1 - 2 - 2 * E**-0.1 + 1) / 5, abs=1e-6)
    assert m["actor/clip_cov_frac"] == pytest.approx(1 / 5)
    assert m["actor/pg_clipfrac"] == 0.0
    loss.backward()
    # d/dlogp = -A r / 5: s0 -0.442068, -0.4, -0.361935 ; s1 0 (dropped), +0.2
    expected = torch.tensor([[-2 * E**0.1, -2.0, -2 * E**-0.1], [0.0, 1.0, 0.0]]) / 5
    torch.testing.assert_close(logp_bt.grad, expected)


def test_clip_cov_band_and_ratio():
    logp_bt, old_bt, adv_bt, mask_bt = _cov_case()
    # ub 2: only s0t0 (1.2) is in the band -> it is dropped instead of s1t0
    cfg = PolicyLossConfig(name="clip_cov", clip_cov_ub=2.0)
    loss, _ = clip_cov_loss(logp_bt, old_bt, adv_bt, mask_bt, cfg, NORM)
    assert loss.item() == pytest.approx((-2 - 2 * E**-0.1 + E**0.05 + 1) / 5, abs=1e-6)
    # ratio 0.4: k = int(0.4 * 5) = 2 -> both band tokens dropped
    cfg = PolicyLossConfig(name="clip_cov", clip_cov_ratio=0.4)
    loss, m = clip_cov_loss(logp_bt, old_bt, adv_bt, mask_bt, cfg, NORM)
    assert loss.item() == pytest.approx((-2 - 2 * E**-0.1 + 1) / 5, abs=1e-6)
    assert m["actor/clip_cov_frac"] == pytest.approx(2 / 5)


def test_clip_cov_never_picks_a_token_the_ppo_clip_cut():
    logp_bt, old_bt, adv_bt, mask_bt = _cov_case()
    old_bt = old_bt.clone()
    old_bt[1, 0] += 0.35  # s1t0: log-ratio -0.3, r = 0.740818 < 0.8 with A < 0 -> clipped
    cfg = PolicyLossConfig(name="clip_cov")
    loss, m = clip_cov_loss(logp_bt, old_bt, adv_bt, mask_bt, cfg, NORM)
    # s1t0 (cov 2.7) keeps its clipped PPO term max(0.740818, 0.8) = 0.8;
    # s0t0 (cov 1.2, the only other band token) is dropped instead
    # (-2 - 2 e^-0.1 + 0.8 + 1) / 5 = (-2 - 1.809675 + 1.8) / 5 = -0.401935
    assert loss.item() == pytest.approx((-2 - 2 * E**-0.1 + 0.8 + 1) / 5, abs=1e-6)
    assert m["actor/pg_clipfrac"] == pytest.approx(1 / 5)


def test_kl_cov_hand_values_and_gradient():
    logp_bt, old_bt, adv_bt, mask_bt = _cov_case()
    cfg = PolicyLossConfig(name="kl_cov")  # ratio 2e-4 -> k = 1, ppo_kl_coef 1
    loss, m = kl_cov_loss(logp_bt, old_bt, adv_bt, mask_bt, cfg, NORM)
    # top covariance: s1t0 (2.7) gets + |log r| = 0.05: e^0.05 + 0.05 = 1.101271
    # others -A r (unclipped): -2.210342, -2, -1.809675, +1
    # token-mean: (-2.210342 - 2 - 1.809675 + 1.101271 + 1) / 5 = -0.783749
    assert loss.item() == pytest.approx(
        (-2 * E**0.1 - 2 - 2 * E**-0.1 + E**0.05 + 0.05 + 1) / 5, abs=1e-6
    )
    assert m["actor/kl_cov_frac"] == pytest.approx(1 / 5)
    loss.backward()
    # s1t0: (r + sign(log r)) / 5 = (1.051271 + 1) / 5 = 0.410254 ; the rest -A r / 5
    expected = torch.tensor([[-2 * E**0.1, -2.0, -2 * E**-0.1], [E**0.05 + 1, 1.0, 0.0]]) / 5
    torch.testing.assert_close(logp_bt.grad, expected)


def test_kl_cov_does_not_clip():
    logp_bt, old_bt, adv_bt, mask_bt = _case()
    cfg = PolicyLossConfig(name="kl_cov", ppo_kl_coef=0.0)
    loss, _ = kl_cov_loss(logp_bt, old_bt, adv_bt, mask_bt, cfg, NORM)
    # -A r summed: -(e^0.1 + e^0.5 + e^-0.5) + (e^-0.6 + e^0.3) = -1.462213 ; / 5 = -0.292443
    expected = (-(E**0.1 + E**0.5 + E**-0.5) + E**-0.6 + E**0.3) / 5
    assert loss.item() == pytest.approx(expected, abs=1e-6)


# --- shared ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "agg"),
    [
        ("cispo", "token-mean"),
        ("sapo", "seq-mean-token-mean"),
        ("geo_mean", "seq-mean-token-mean"),
        ("kl_cov", "token-mean"),
    ],
)
def test_on_policy_gradient_is_the_plain_policy_gradient(name, agg):
    # At r = 1 (old = the current logp, detached) every one of these has PPO's gradient
    # -A grad(logp): cispo's weight is 1, sapo's gate slope 4 * 1/4 = 1, gmpo's geometric
    # mean has d s / d logp_t = 1 / n_i (as seq-mean-token-mean), kl_cov's |log r| has
    # slope 0 at 0. Reference: ppo_clip with the same aggregation.
    gen = torch.Generator().manual_seed(4)
    logp_bt = (-torch.rand(3, 5, generator=gen) * 3).requires_grad_()
    adv_b = torch.randn(3, generator=gen)
    adv_bt = adv_b[:, None].expand(3, 5).contiguous()
    mask_bt = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    norm = LossNorm(9, 3)
    loss, _ = POLICY_LOSSES[name](
        logp_bt, logp_bt.detach(), adv_bt, mask_bt, PolicyLossConfig(name=name, agg=agg), norm
    )
    loss.backward()
    ref_bt = logp_bt.detach().clone().requires_grad_()
    ref, _ = ppo_clip_loss(
        ref_bt, ref_bt.detach(), adv_bt, mask_bt, PolicyLossConfig(agg=agg), norm
    )
    ref.backward()
    torch.testing.assert_close(logp_bt.grad, ref_bt.grad)


def test_registry_and_config_checks():
    for name in ("cispo", "sapo", "geo_mean", "gmpo", "clip_cov", "kl_cov"):
        assert build_policy_loss(PolicyLossConfig(name=name)) is POLICY_LOSSES[name]
    assert build_policy_loss(PolicyLossConfig(name="sapo")) is sapo_loss
    with pytest.raises(ValueError) as err:
        PolicyLossConfig(tau_pos=0.0, clip_cov_ratio=0.0, clip_cov_lb=5.0, ppo_kl_coef=-1.0)
    for key in ("tau_pos=0.0", "clip_cov_ratio=0.0", "clip_cov_lb=5.0", "ppo_kl_coef=-1.0"):
        assert key in str(err.value)
    PolicyLossConfig(clip_low=1.0)  # no lower bound is allowed (cispo)
