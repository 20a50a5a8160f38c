# Shapes: b = samples, t = tokens. prox = the trainer's old log-probs, behav = the rollout's.
import math

import pytest
import torch

from rlpost.algos import (
    OFF_POLICY,
    LossNorm,
    OffPolicyConfig,
    PolicyLossConfig,
    build_off_policy,
    ppo_clip_loss,
    register_off_policy,
    truncated_is_weight,
)

LN = math.log


def _run(name, prox_bt, behav_bt, mask_bt, adv_bt=None, logp_bt=None, **cfg):
    adv_bt = torch.ones_like(prox_bt) if adv_bt is None else adv_bt
    logp_bt = prox_bt if logp_bt is None else logp_bt
    return OFF_POLICY[name](
        logp_bt, prox_bt, behav_bt, mask_bt, adv_bt, OffPolicyConfig(name, **cfg)
    )


def _token_case():
    # rho = pi_prox / pi_behav = 1, 1.5, 3 on the response; the 4th token is not one
    prox_bt = torch.tensor([[0.0, LN(1.5), LN(3.0), 5.0]])
    return prox_bt, torch.zeros(1, 4), torch.tensor([[1, 1, 1, 0]])


def test_token_is_by_hand():
    w, m = _run("token_is", *_token_case(), is_cap=2.0)
    # min(rho, 2) = 1, 1.5, 2 (capped); 0 off the mask
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.5, 2.0, 0.0]]))
    assert m["off_policy/is_mean"] == pytest.approx(1.5)  # (1 + 1.5 + 2) / 3
    assert m["off_policy/is_max"] == pytest.approx(2.0)
    assert m["off_policy/clipped_frac"] == pytest.approx(1 / 3)  # the token with rho = 3
    assert m["off_policy/rejected_frac"] == 0.0
    # ess = (sum w)^2 / (n sum w^2) = 4.5^2 / (3 * (1 + 2.25 + 4)) = 20.25 / 21.75 = 0.931034
    assert m["off_policy/ess"] == pytest.approx(20.25 / 21.75)
    # kl_behav = mean(behav - prox) = -(0 + ln 1.5 + ln 3) / 3 = -ln 4.5 / 3 = -0.501359
    assert m["off_policy/kl_behav"] == pytest.approx(-LN(4.5) / 3)


def test_token_is_matches_the_trainers_truncated_weight_exactly():
    # the default entry must give today's numbers bit for bit
    g = torch.Generator().manual_seed(0)
    prox = torch.randn(4, 7, generator=g)
    behav = prox + 0.5 * torch.randn(4, 7, generator=g)
    mask = (torch.rand(4, 7, generator=g) > 0.2).float()
    w, m = _run("token_is", prox, behav, mask, is_cap=1.3)
    w_ref, m_ref = truncated_is_weight(prox, behav, mask, 1.3)
    assert torch.equal(w, w_ref)
    assert m["off_policy/is_mean"] == pytest.approx(m_ref["rollout/is_weight_mean"])
    assert m["off_policy/clipped_frac"] == pytest.approx(m_ref["rollout/is_capped_frac"])


def test_on_policy_samples_are_untouched_by_every_entry():
    logp = torch.randn(3, 5)
    mask = torch.ones(3, 5)
    adv = -torch.ones(3, 5)  # opsm looks at negative samples only
    for name in OFF_POLICY:
        w, m = OFF_POLICY[name](logp, logp, logp.clone(), mask, adv, OffPolicyConfig(name))
        torch.testing.assert_close(w, mask, msg=name)
        assert m["off_policy/ess"] == pytest.approx(1.0), name
        assert m["off_policy/kl_behav"] == 0.0, name
        assert m["off_policy/rejected_frac"] == m["off_policy/clipped_frac"] == 0.0, name


def test_seq_is_by_hand_in_log_space():
    # sample 0: log rho = ln 2, ln 2 -> prod 4 -> min(4, 3) = 3 on both tokens
    # sample 1: log rho = ln 0.5, ln 2 -> prod 1; its masked 3rd token (ln 100) is ignored
    prox = torch.tensor([[LN(2.0), LN(2.0), 0.0], [LN(0.5), LN(2.0), LN(100.0)]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    w, m = _run("seq_is", prox, torch.zeros(2, 3), mask, is_cap=3.0)
    torch.testing.assert_close(w, torch.tensor([[3.0, 3.0, 0.0], [1.0, 1.0, 0.0]]))
    assert m["off_policy/is_mean"] == pytest.approx(2.0)  # (3 + 3 + 1 + 1) / 4
    assert m["off_policy/clipped_frac"] == pytest.approx(0.5)  # sample 0's two tokens of 4
    assert m["off_policy/ess"] == pytest.approx(0.8)  # 8^2 / (4 * (9 + 9 + 1 + 1)) = 64 / 80


def test_seq_is_long_product_does_not_overflow():
    # 200 tokens of log rho = 5: prod = e^1000 (inf in float32), sum in log space -> the cap
    prox = torch.full((1, 200), 5.0)
    w, m = _run("seq_is", prox, torch.zeros(1, 200), torch.ones(1, 200), is_cap=2.0)
    torch.testing.assert_close(w, torch.full((1, 200), 2.0))
    assert m["off_policy/clipped_frac"] == 1.0 and math.isfinite(m["off_policy/ess"])


def test_decoupled_drops_tokens_above_the_cap():
    w, m = _run("decoupled", *_token_case(), is_cap=2.0)
    # AReaL's behav_imp_weight_cap: rho = 1, 1.5 kept as they are; rho = 3 > 2 -> 0, not 2
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.5, 0.0, 0.0]]))
    assert m["off_policy/rejected_frac"] == pytest.approx(1 / 3)
    assert m["off_policy/clipped_frac"] == 0.0
    assert m["off_policy/is_mean"] == pytest.approx(2.5 / 3)  # (1 + 1.5 + 0) / 3
    # ess = 2.5^2 / (3 * (1 + 2.25)) = 6.25 / 9.75 = 0.641026
    assert m["off_policy/ess"] == pytest.approx(6.25 / 9.75)


@pytest.mark.parametrize("name", ["decoupled", "token_is", "icepop"])
def test_behaviour_weight_scales_the_ppo_gradient_and_is_detached(name):
    # decoupled PPO: loss = w_t * clippedPPO(pi_theta / pi_prox), with logp = prox at the
    # first step (r = 1, nothing clipped): d loss / d logp_t = -A w_t r / n = -w_t / 3
    prox, behav, mask = _token_case()
    prox = prox.clone().requires_grad_(True)  # a weight must not carry gradient to prox
    logp = prox.detach().clone().requires_grad_(True)
    adv = torch.ones(1, 4)
    w, _ = OFF_POLICY[name](logp, prox, behav, mask, adv, OffPolicyConfig(name, is_cap=2.0))
    assert not w.requires_grad
    loss, _ = ppo_clip_loss(logp, prox.detach(), adv * w, mask, PolicyLossConfig(), LossNorm(3, 1))
    loss.backward()
    expected = {
        "decoupled": [1.0, 1.5, 0.0],
        "token_is": [1.0, 1.5, 2.0],
        "icepop": [1.0, 1.5, 0.0],
    }[name]
    # decoupled: -(1, 1.5, 0) / 3 ; token_is: -(1, 1.5, 2) / 3 ; icepop (band [0.5, 2]):
    # -(1, 1.5, 0) / 3 ; masked token: 0
    torch.testing.assert_close(logp.grad, -torch.tensor([expected + [0.0]]) / 3)
    assert prox.grad is None


def test_icepop_weights_tokens_inside_the_band_by_their_ratio():
    # IcePop, M(k) = k in [lo, hi] else 0: rho = 1, 0.4, 2.5, 1.9 with [0.5, 2]
    # -> 1, 0 (0.4 < 0.5), 0 (2.5 > 2), 1.9 (kept at its ratio, not at 1)
    prox = torch.tensor([[0.0, LN(0.4), LN(2.5), LN(1.9)]])
    w, m = _run("icepop", prox, torch.zeros(1, 4), torch.ones(1, 4), lo=0.5, hi=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 0.0, 0.0, 1.9]]))
    assert m["off_policy/rejected_frac"] == pytest.approx(0.5)  # 2 of 4
    assert m["off_policy/is_mean"] == pytest.approx(2.9 / 4)  # (1 + 1.9) / 4 = 0.725
    assert m["off_policy/is_max"] == pytest.approx(1.9)
    # ess = 2.9^2 / (4 * (1 + 1.9^2)) = 8.41 / 18.44 = 0.456074
    assert m["off_policy/ess"] == pytest.approx(8.41 / 18.44)


def test_icepop_lower_bound_defaults_to_the_reciprocal():
    # hi = 2, lo unset -> 1/2: rho = 0.4 rejected, 0.6 kept at 0.6
    prox = torch.tensor([[LN(0.4), LN(0.6)]])
    w, _ = _run("icepop", prox, torch.zeros(1, 2), torch.ones(1, 2), hi=2.0)
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.6]]))


def _k_case():
    # one sample, log rho = 0.1, -0.2, 0.3 on the response; the 4th token (log rho 5,
    # k2 = 12.5) is off the mask and must not count
    # k1 = -log rho             = -0.1,      0.2,      -0.3
    # k2 = (log rho)^2 / 2      =  0.005,    0.02,      0.045
    # k3 = rho - 1 - log rho    =  0.005171, 0.018731,  0.049859
    #      (e^0.1 - 1.1 = 1.105171 - 1.1; e^-0.2 - 0.8 = 0.818731 - 0.8; e^0.3 - 1.3 = 1.349859 - 1.3)
    prox = torch.tensor([[0.1, -0.2, 0.3, 5.0]])
    return prox, torch.zeros(1, 4), torch.tensor([[1, 1, 1, 0]])


@pytest.mark.parametrize(
    ("name", "cfg", "kept"),
    [
        # k1 in [log lo, log hi] = [-ln 1.25, ln 1.25] = [-0.2231, 0.2231]: -0.3 out
        ("token_k1", {"hi": 1.25}, [1.0, 1.0, 0.0]),
        # k2 <= 0.019: 0.02 and 0.045 out
        ("token_k2", {"kl_max": 0.019}, [1.0, 0.0, 0.0]),
        # k3 <= 0.019: 0.018731 kept (k3 < k2 for a negative log rho), 0.049859 out
        ("token_k3", {"kl_max": 0.019}, [1.0, 1.0, 0.0]),
    ],
)
def test_token_rejections_by_hand(name, cfg, kept):
    w, m = _run(name, *_k_case(), **cfg)
    torch.testing.assert_close(w, torch.tensor([kept + [0.0]]))
    assert m["off_policy/rejected_frac"] == pytest.approx(kept.count(0.0) / 3)
    assert m["off_policy/clipped_frac"] == 0.0


def test_token_k1_is_the_band_with_weight_one_and_icepop_the_band_with_rho():
    # lo = 1/hi: both keep rho in [0.5, 2]; token_k1 gives the kept tokens 1, icepop rho
    prox = torch.tensor([[0.0, LN(0.4), LN(2.5), LN(1.9)]])
    args = (prox, torch.zeros(1, 4), torch.ones(1, 4))
    w_k1, _ = _run("token_k1", *args, hi=2.0)
    w_ice, _ = _run("icepop", *args, hi=2.0)
    torch.testing.assert_close(w_k1, torch.tensor([[1.0, 0.0, 0.0, 1.0]]))
    torch.testing.assert_close(w_ice, torch.tensor([[1.0, 0.0, 0.0, 1.9]]))


def test_k1_band_bounds_the_inverse_ratio_as_verl_reads_it():
    # verl's "lo_hi" for k1 bounds k1 = log(pi_behav / pi_prox): lo = 0.25, hi = 2 keeps
    # pi_behav / pi_prox = 1 / rho in [0.25, 2], i.e. rho in [0.5, 4];
    # rho = 1, 0.4, 2.5, 1.9 -> 1/rho = 1, 2.5 (out), 0.4, 0.526 -> kept 1, 0, 1, 1
    prox = torch.tensor([[0.0, LN(0.4), LN(2.5), LN(1.9)]])
    args = (prox, torch.zeros(1, 4), torch.ones(1, 4))
    w, _ = _run("token_k1", *args, lo=0.25, hi=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 0.0, 1.0, 1.0]]))
    # icepop bounds rho itself: rho in [0.25, 2] -> 1, 0.4, 0 (2.5 > 2), 1.9
    w, _ = _run("icepop", *args, lo=0.25, hi=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 0.4, 0.0, 1.9]]))


def _seq_case():
    # sample 0: log rho = 0.1, 0.1, 0.1
    #   k1 = -0.1 each: sum -0.3, mean -0.1
    #   k2 = 0.005 each: sum 0.015, mean 0.005, max 0.005
    #   k3 = 0.005171 each: sum 0.015513, mean 0.005171, max 0.005171
    # sample 1: log rho = 0.3, -0.3 and a 3rd token off the mask (log rho 5)
    #   k1 = -0.3, 0.3: sum 0, mean 0
    #   k2 = 0.045, 0.045: sum 0.09, mean 0.045, max 0.045
    #   k3 = 0.049859, 0.040818 (e^-0.3 - 0.7 = 0.740818 - 0.7): sum 0.090677,
    #        mean 0.045338, max 0.049859
    prox = torch.tensor([[0.1, 0.1, 0.1], [0.3, -0.3, 5.0]])
    return prox, torch.zeros(2, 3), torch.tensor([[1, 1, 1], [1, 1, 0]])


@pytest.mark.parametrize(
    ("name", "cfg", "kept_b"),
    [
        # band [-ln 1.2, ln 1.2] = [-0.1823, 0.1823]: sum -0.3 out, 0 in
        ("seq_sum_k1", {"hi": 1.2}, [0, 1]),
        # mean -0.1 in, 0 in (sample 1's tokens, |k1| = 0.3, would each fail token_k1)
        ("seq_mean_k1", {"hi": 1.2}, [1, 1]),
        # kl_max 0.012: sums 0.015 and 0.09 both out
        ("seq_sum_k2", {"kl_max": 0.012}, [0, 0]),
        ("seq_sum_k3", {"kl_max": 0.012}, [0, 0]),
        # kl_max 0.046: sum 0.015 in, 0.09 out; mean 0.005 in, 0.045 in; max likewise
        ("seq_sum_k2", {"kl_max": 0.046}, [1, 0]),
        ("seq_mean_k2", {"kl_max": 0.046}, [1, 1]),
        ("seq_max_k2", {"kl_max": 0.046}, [1, 1]),
        # k3 at 0.046: sum 0.090677 out; mean 0.045338 in; max 0.049859 out
        ("seq_sum_k3", {"kl_max": 0.046}, [1, 0]),
        ("seq_mean_k3", {"kl_max": 0.046}, [1, 1]),
        ("seq_max_k3", {"kl_max": 0.046}, [1, 0]),
        # kl_max 0.012 for means and maxes: sample 0 (0.005, 0.005171) in, sample 1 out
        ("seq_mean_k2", {"kl_max": 0.012}, [1, 0]),
        ("seq_max_k3", {"kl_max": 0.012}, [1, 0]),
    ],
)
def test_sequence_rejections_by_hand(name, cfg, kept_b):
    prox, behav, mask = _seq_case()
    w, m = _run(name, prox, behav, mask, **cfg)
    expected = torch.tensor(kept_b, dtype=torch.float32)[:, None] * mask
    torch.testing.assert_close(w, expected)
    # rejected_frac counts mask tokens: sample 0 has 3, sample 1 has 2, of 5
    assert m["off_policy/rejected_frac"] == pytest.approx(
        ((1 - kept_b[0]) * 3 + (1 - kept_b[1]) * 2) / 5
    )


def test_every_verl_rejection_criterion_is_registered():
    names = {f"token_k{k}" for k in (1, 2, 3)} | {
        f"seq_{r}_k{k}" for r in ("sum", "mean") for k in (1, 2, 3)
    }
    names |= {"seq_max_k2", "seq_max_k3"}
    assert names <= set(OFF_POLICY)


def test_mis_rejects_sequences_by_their_geometric_mean():
    # sample 0: log rho = ln 4, ln 0.25 -> mean 0 -> gm 1 in [0.5, 2]: kept (its token rho 4
    #           would be masked by icepop; the geometric mean is not)
    # sample 1: ln 4, ln 4 -> gm 4 > 2: rejected
    # sample 2: ln 0.5, ln 0.125 -> mean ln(1/16) / 2 = ln 0.25 -> gm 0.25 < 0.5: rejected
    prox = torch.tensor([[LN(4), LN(0.25)], [LN(4), LN(4)], [LN(0.5), LN(0.125)]])
    w, m = _run("mis", prox, torch.zeros(3, 2), torch.ones(3, 2), lo=0.5, hi=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]))
    assert m["off_policy/rejected_frac"] == pytest.approx(4 / 6)


def test_mis_mean_ignores_masked_tokens():
    # log rho over the mask = ln 1.5 (one token) -> gm 1.5 <= 2 kept; the masked ln 100 ignored
    prox = torch.tensor([[LN(1.5), LN(100.0)]])
    w, _ = _run("mis", prox, torch.zeros(1, 2), torch.tensor([[1, 0]]), hi=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 0.0]]))


def _opsm_case():
    # per-sample k1 KL(behav || theta) = mean(behav - logp): 0.5, 0.5, 0.05 ; A = -1, +1, -1
    behav = torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    logp = torch.tensor([[-0.4, -0.6], [-0.5, -0.5], [-0.1, 0.0]], requires_grad=True)
    adv = torch.tensor([[-1.0, -1.0], [1.0, 1.0], [-1.0, -1.0]])
    return logp, behav, adv


def test_opsm_masks_negative_samples_that_drifted():
    logp, behav, adv = _opsm_case()
    mask = torch.ones(3, 2)
    w, m = OFF_POLICY["opsm"](logp, behav, behav, mask, adv, OffPolicyConfig("opsm", delta=0.1))
    # sample 0: A < 0 and 0.5 > 0.1 -> masked; sample 1: A > 0 -> kept whatever the KL;
    # sample 2: A < 0 but 0.05 <= 0.1 -> kept
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]))
    assert m["off_policy/rejected_frac"] == pytest.approx(2 / 6)
    assert not w.requires_grad


def test_opsm_masked_sample_gets_no_gradient():
    logp, behav, adv = _opsm_case()
    mask = torch.ones(3, 2)
    w, _ = OFF_POLICY["opsm"](logp, behav, behav, mask, adv, OffPolicyConfig("opsm", delta=0.1))
    old = logp.detach()  # r = 1: d loss / d logp_t = -A w_t / 6
    loss, _ = ppo_clip_loss(logp, old, adv * w, mask, PolicyLossConfig(), LossNorm(6, 3))
    loss.backward()
    # sample 0: w = 0 -> 0 ; sample 1: -(+1) / 6 ; sample 2: -(-1) / 6
    expected = torch.tensor([[0.0, 0.0], [-1.0, -1.0], [1.0, 1.0]]) / 6
    torch.testing.assert_close(logp.grad, expected)


def test_no_mask_tokens_give_finite_metrics():
    z = torch.zeros(2, 3)
    for name in OFF_POLICY:
        _, m = OFF_POLICY[name](z, z, z, z, z, OffPolicyConfig(name))
        assert all(math.isfinite(v) for v in m.values()), name
        assert m["off_policy/ess"] == 0.0, name


def test_registry_lookup_and_errors():
    assert set(OFF_POLICY) >= {"none", "token_is", "seq_is", "decoupled", "icepop", "mis", "opsm"}
    assert build_off_policy(OffPolicyConfig("mis")) is OFF_POLICY["mis"]
    with pytest.raises(KeyError, match=r"algo.off_policy.name='nope'.*token_is"):
        build_off_policy(OffPolicyConfig("nope"))
    with pytest.raises(ValueError, match="already registered"):
        register_off_policy("token_is")(OFF_POLICY["none"])


def test_a_user_entry_registers_by_name():
    @register_off_policy("test_half")
    def half(logp_bt, prox_logp_bt, behav_logp_bt, mask_bt, adv_bt, cfg):
        return 0.5 * mask_bt, {}

    try:
        w, _ = build_off_policy(OffPolicyConfig("test_half"))(*[torch.ones(1, 2)] * 5, None)
        torch.testing.assert_close(w, torch.full((1, 2), 0.5))
    finally:
        del OFF_POLICY["test_half"]


def test_bad_config_names_every_key():
    with pytest.raises(ValueError) as err:
        OffPolicyConfig(is_cap=0.0, lo=3.0, hi=2.0, delta=-1.0)
    msg = str(err.value)
    for key in ("is_cap=0.0", "lo=3.0", "delta=-1.0"):
        assert key in msg
    with pytest.raises(ValueError, match="hi=0.5"):
        OffPolicyConfig(hi=0.5)  # lo unset would be 2 > hi
