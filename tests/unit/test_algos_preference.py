# Shapes: p = pairs.
import math

import pytest
import torch

from rlpost.algos import (
    PREFERENCE_LOSSES,
    PreferenceConfig,
    bradley_terry_loss,
    build_preference_loss,
    register_preference_loss,
)

SIG = 1 / (1 + math.exp(-0.5))  # sigma(0.5) = 0.622459


def _pair(c: float, r: float):
    return (
        torch.tensor([c], requires_grad=True),
        torch.tensor([r], requires_grad=True),
    )


def _ref():
    return torch.tensor([-1.5]), torch.tensor([-1.5])


def test_dpo_sigmoid_hand_values_and_gradient():
    c, r = _pair(-1.0, -2.0)
    loss, m = PREFERENCE_LOSSES["sigmoid"].fn(c, r, *_ref(), PreferenceConfig(beta=0.5), 1)
    # r_c = 0.5 (-1 + 1.5) = 0.25, r_r = 0.5 (-2 + 1.5) = -0.25, h = 0.5
    # loss = -log sigma(0.5) = log(1 + e^-0.5) = 0.474077
    assert loss.item() == pytest.approx(math.log1p(math.exp(-0.5)), abs=1e-6)
    assert m["rewards/chosen"] == pytest.approx(0.25)
    assert m["rewards/rejected"] == pytest.approx(-0.25)
    assert m["rewards/margins"] == pytest.approx(0.5)
    assert m["rewards/accuracies"] == 1.0
    assert m["logps/chosen"] == pytest.approx(-1.0) and m["logps/rejected"] == pytest.approx(-2.0)
    loss.backward()
    # dloss/dh = -sigma(-h) = -0.377541; dh/dlogp_c = beta = 0.5 -> -0.188771, rejected +
    assert c.grad.item() == pytest.approx(-(1 - SIG) * 0.5, abs=1e-6)
    assert r.grad.item() == pytest.approx((1 - SIG) * 0.5, abs=1e-6)


def test_conservative_dpo_label_smoothing():
    c, r = _pair(-1.0, -2.0)
    cfg = PreferenceConfig(beta=0.5, label_smoothing=0.1)
    loss, _ = PREFERENCE_LOSSES["sigmoid"].fn(c, r, *_ref(), cfg, 1)
    # 0.9 (-log sigma(0.5)) + 0.1 (-log sigma(-0.5)) = 0.9 * 0.474077 + 0.1 * 0.974077 = 0.524077
    assert loss.item() == pytest.approx(
        0.9 * math.log1p(math.exp(-0.5)) + 0.1 * math.log1p(math.exp(0.5)), abs=1e-6
    )
    loss.backward()
    # dloss/dh = -0.9 sigma(-h) + 0.1 sigma(h) = -0.339787 + 0.062246 = -0.277541; x beta
    assert c.grad.item() == pytest.approx((-0.9 * (1 - SIG) + 0.1 * SIG) * 0.5, abs=1e-6)


def test_ipo_hand_values_and_gradient():
    c, r = _pair(-1.0, -2.0)
    loss, m = PREFERENCE_LOSSES["ipo"].fn(c, r, *_ref(), PreferenceConfig(beta=0.25), 1)
    # h = (-1 + 1.5) - (-2 + 1.5) = 1.0; target 1 / (2 * 0.25) = 2 -> (1 - 2)^2 = 1
    assert loss.item() == pytest.approx(1.0, abs=1e-6)
    assert m["rewards/margins"] == pytest.approx(0.25)  # beta h
    loss.backward()
    # dloss/dh = 2 (h - 2) = -2; dh/dlogp_c = 1, dh/dlogp_r = -1
    assert c.grad.item() == pytest.approx(-2.0) and r.grad.item() == pytest.approx(2.0)


def test_hinge_hand_values_and_gradient():
    c, r = _pair(-1.0, -2.0)
    loss, _ = PREFERENCE_LOSSES["hinge"].fn(c, r, *_ref(), PreferenceConfig(beta=0.5), 1)
    # max(0, 1 - beta h) = max(0, 1 - 0.5) = 0.5; gradient -beta on chosen, +beta on rejected
    assert loss.item() == pytest.approx(0.5)
    loss.backward()
    assert c.grad.item() == pytest.approx(-0.5) and r.grad.item() == pytest.approx(0.5)
    # past the margin (beta h >= 1) the loss and its gradient are 0
    c2, r2 = _pair(1.0, -2.0)  # beta h = 0.5 * 3 = 1.5
    loss2, _ = PREFERENCE_LOSSES["hinge"].fn(c2, r2, *_ref(), PreferenceConfig(beta=0.5), 1)
    loss2.backward()
    assert loss2.item() == 0.0 and c2.grad.item() == 0.0


def test_simpo_is_reference_free_with_margin():
    spec = PREFERENCE_LOSSES["simpo"]
    assert not spec.needs_reference and spec.length_normalised
    c, r = _pair(-0.5, -1.0)  # per-token mean log-probs
    cfg = PreferenceConfig(loss="simpo", beta=2.0, simpo_gamma=0.5)
    loss, m = spec.fn(c, r, None, None, cfg, 1)
    # beta c - beta r - gamma = -1 + 2 - 0.5 = 0.5 -> -log sigma(0.5) = 0.474077
    assert loss.item() == pytest.approx(math.log1p(math.exp(-0.5)), abs=1e-6)
    assert m["rewards/chosen"] == pytest.approx(-1.0)  # beta * mean log-prob
    loss.backward()
    # -sigma(-0.5) * beta = -0.377541 * 2 = -0.755081
    assert c.grad.item() == pytest.approx(-(1 - SIG) * 2, abs=1e-6)
    assert r.grad.item() == pytest.approx((1 - SIG) * 2, abs=1e-6)


def test_orpo_odds_ratio_plus_nll():
    spec = PREFERENCE_LOSSES["orpo"]
    assert not spec.needs_reference and spec.length_normalised
    c, r = _pair(math.log(0.5), math.log(0.25))
    cfg = PreferenceConfig(loss="orpo", beta=0.1)
    loss, m = spec.fn(c, r, None, None, cfg, 1)
    # log odds: chosen log(0.5 / 0.5) = 0, rejected log(0.25 / 0.75) = -1.098612
    # D = 1.098612 = log 3 -> log sigma(D) = log(3/4) = -0.287682
    # loss = nll + beta * 0.287682 = 0.693147 + 0.028768 = 0.721916
    assert loss.item() == pytest.approx(math.log(2) - 0.1 * math.log(0.75), abs=1e-6)
    assert m["orpo/log_odds_ratio"] == pytest.approx(math.log(0.75), abs=1e-6)
    assert m["orpo/nll_loss"] == pytest.approx(math.log(2), abs=1e-6)
    loss.backward()
    # d/dc: -1 (nll) - beta sigma(-D) dD/dc, dD/dc = 1 / (1 - e^c) = 2 -> -1 - 0.1 * 0.25 * 2 = -1.05
    assert c.grad.item() == pytest.approx(-1.05, abs=1e-5)
    # d/dr: -beta sigma(-D) dD/dr, dD/dr = -1 / (1 - e^r) = -4/3 -> +0.033333
    assert r.grad.item() == pytest.approx(0.1 * 0.25 * 4 / 3, abs=1e-5)


def test_loss_is_a_share_of_the_global_pair_mean():
    # two pairs in this micro-batch, four in the global batch: half of their mean
    c = torch.tensor([-1.0, -1.0])
    r = torch.tensor([-2.0, -2.0])
    ref = torch.tensor([-1.5, -1.5])
    cfg = PreferenceConfig(beta=0.5)
    loss, m = PREFERENCE_LOSSES["sigmoid"].fn(c, r, ref, ref, cfg, 4)
    # each pair 0.474077 -> (2 * 0.474077) / 4 = 0.237039
    assert loss.item() == pytest.approx(math.log1p(math.exp(-0.5)) / 2, abs=1e-6)
    assert m["rewards/accuracies"] == pytest.approx(0.5)  # 2 right of the 4 pairs


def test_reference_losses_refuse_missing_reference():
    c, r = _pair(-1.0, -2.0)
    with pytest.raises(ValueError, match="reference"):
        PREFERENCE_LOSSES["sigmoid"].fn(c, r, None, None, PreferenceConfig(), 1)


def test_config_checks_and_registry():
    with pytest.raises(
        ValueError, match="label_smoothing=0.1: conservative DPO smooths the sigmoid"
    ):
        PreferenceConfig(loss="ipo", label_smoothing=0.1)
    with pytest.raises(ValueError, match="beta"):
        PreferenceConfig(beta=0.0)
    with pytest.raises(KeyError, match="choose one of"):
        build_preference_loss(PreferenceConfig(loss="nope"))
    with pytest.raises(ValueError, match="already registered"):
        register_preference_loss("sigmoid")(PREFERENCE_LOSSES["sigmoid"].fn)
    assert set(PREFERENCE_LOSSES) >= {"sigmoid", "ipo", "hinge", "simpo", "orpo"}


def test_bradley_terry_with_margin_and_centering():
    rc = torch.tensor([1.0], requires_grad=True)
    rr = torch.tensor([0.0], requires_grad=True)
    loss, m = bradley_terry_loss(rc, rr, 1, margin_p=torch.tensor([0.5]), center_coef=0.01)
    # -log sigma(1 - 0 - 0.5) = 0.474077, + 0.01 (1 + 0)^2 = 0.484077
    assert loss.item() == pytest.approx(math.log1p(math.exp(-0.5)) + 0.01, abs=1e-6)
    assert m["rm/accuracy"] == 1.0 and m["rm/margin"] == pytest.approx(1.0)
    loss.backward()
    # d/dr_c = -sigma(-0.5) + 0.02 (r_c + r_r) = -0.377541 + 0.02 = -0.357541
    assert rc.grad.item() == pytest.approx(-(1 - SIG) + 0.02, abs=1e-6)
    # d/dr_r = +sigma(-0.5) + 0.02 = 0.397541
    assert rr.grad.item() == pytest.approx((1 - SIG) + 0.02, abs=1e-6)
    # without a margin: -log sigma(1) = 0.313262
    plain, _ = bradley_terry_loss(torch.tensor([1.0]), torch.tensor([0.0]), 1)
    assert plain.item() == pytest.approx(math.log1p(math.exp(-1.0)), abs=1e-6)


def test_trainer_cuts_interleaved_rows_into_pairs():
    from rlpost.algos import LossNorm
    from rlpost.trainers.batch import TrajectoryBatch
    from rlpost.trainers.preference import REF_LOGPS, preference_loss, reward_model_loss

    # two pairs, rows (c0, r0, c1, r1); three tokens each, the last two the response
    mb = TrajectoryBatch(
        input_ids_bt=torch.zeros(4, 3, dtype=torch.long),
        attention_mask_bt=torch.ones(4, 3, dtype=torch.long),
        response_mask_bt=torch.tensor([[0, 1, 1]] * 4),
        group_ids_b=torch.tensor([0, 0, 1, 1]),
        scores_b={REF_LOGPS: torch.tensor([-1.5, -1.5, -1.5, -1.5]), "margin": torch.zeros(4)},
    )
    # per-token log-probs: row sums over the response -1, -2, -1, -2 (position 0 ignored)
    logp_bt = torch.tensor([[-9.0, -0.5, -0.5], [-9.0, -1.0, -1.0]] * 2, requires_grad=True)
    loss_fn = preference_loss(lambda mb, out: out, PreferenceConfig(beta=0.5))
    loss, metrics, _ = loss_fn(mb, logp_bt, LossNorm(global_tokens=8, global_samples=4))
    # both pairs: h = 0.5 as in the single-pair case -> mean loss 0.474077
    assert loss.item() == pytest.approx(math.log1p(math.exp(-0.5)), abs=1e-6)
    assert metrics["rewards/accuracies"] == 1.0
    loss.backward()
    # each response token of a chosen row: -sigma(-0.5) * beta / 2 pairs = -0.094385
    assert logp_bt.grad[0].tolist() == pytest.approx([0.0, -(1 - SIG) * 0.25, -(1 - SIG) * 0.25])
    # the Bradley-Terry loss reads one reward per row: r = (1, 0, 1, 0)
    bt_fn = reward_model_loss(lambda r_b: r_b, 0.0)
    bt, bt_metrics, _ = bt_fn(mb, torch.tensor([1.0, 0.0, 1.0, 0.0]), LossNorm(8, 4))
    assert bt.item() == pytest.approx(math.log1p(math.exp(-1.0)), abs=1e-6)  # -log sigma(1)
    assert bt_metrics["rm/accuracy"] == 1.0
    # a micro-batch that splits a pair is refused
    with pytest.raises(ValueError, match="whole pairs"):
        bt_fn(mb.select(slice(0, 3)), torch.tensor([1.0, 0.0, 1.0]), LossNorm(6, 3))


def test_rpo_adds_the_chosen_completions_mean_nll():
    from rlpost.algos import LossNorm
    from rlpost.trainers.batch import TrajectoryBatch
    from rlpost.trainers.preference import REF_LOGPS, preference_loss

    # one pair: chosen response tokens -0.5, -0.5 (sum -1, mean -0.5), rejected -1, -1
    mb = TrajectoryBatch(
        input_ids_bt=torch.zeros(2, 3, dtype=torch.long),
        attention_mask_bt=torch.ones(2, 3, dtype=torch.long),
        response_mask_bt=torch.tensor([[0, 1, 1]] * 2),
        group_ids_b=torch.tensor([0, 0]),
        scores_b={REF_LOGPS: torch.tensor([-1.5, -1.5])},
    )
    logp_bt = torch.tensor([[-9.0, -0.5, -0.5], [-9.0, -1.0, -1.0]], requires_grad=True)
    cfg = PreferenceConfig(beta=0.5, rpo_alpha=2.0)
    loss, metrics, _ = preference_loss(lambda mb, out: out, cfg)(mb, logp_bt, LossNorm(4, 2))
    # DPO's 0.474077 (h = 0.5) + alpha * 0.5 (the chosen mean NLL) = 1.474077
    assert loss.item() == pytest.approx(math.log1p(math.exp(-0.5)) + 2.0 * 0.5, abs=1e-6)
    assert metrics["rpo/nll_loss"] == pytest.approx(0.5)
    loss.backward()
    # a chosen token: DPO's -sigma(-0.5) * beta, plus alpha * -1/|y_c| = -1
    assert logp_bt.grad[0, 1].item() == pytest.approx(-(1 - SIG) * 0.5 - 1.0, abs=1e-6)
    # a rejected token: DPO's only
    assert logp_bt.grad[1, 1].item() == pytest.approx((1 - SIG) * 0.5, abs=1e-6)
    with pytest.raises(ValueError, match="rpo_alpha=-1"):
        PreferenceConfig(rpo_alpha=-1.0)
