"""The Tinker loss functions on hand-computed values, their gradients, the clip
bounds from the config or the inputs, and the names that are not served."""

from __future__ import annotations

import math

import pytest
import torch

from rlpost.serve.errors import UserError
from rlpost.serve.losses import LOSSES, loss_fn

LP = [math.log(0.5), math.log(0.25), math.log(0.8)]
Q = [math.log(0.25), math.log(0.25), math.log(0.4)]  # ratios 2, 1, 2
A = [1.0, -1.0, -2.0]


def lp_q_a():
    return torch.tensor(LP, requires_grad=True), {
        "logprobs": torch.tensor(Q), "advantages": torch.tensor(A),
    }  # fmt: skip


def test_cross_entropy_is_the_weighted_negative_logprob_and_takes_topk_targets():
    lp = torch.tensor(LP)
    per_token = loss_fn("cross_entropy")(lp, {"weights": torch.tensor([0.0, 1.0, 0.5])}, {})
    assert per_token.tolist() == pytest.approx([0.0, math.log(4), -0.5 * math.log(0.8)])
    lp_nk = torch.log(torch.tensor([[0.5, 0.25], [0.1, 0.9]]))
    weights = torch.tensor([[1.0, 1.0], [0.0, 2.0]])
    assert float(loss_fn("cross_entropy")(lp_nk, {"weights": weights}, {}).sum()) == pytest.approx(
        math.log(2) + math.log(4) - 2 * math.log(0.9)
    )


def test_importance_sampling_is_minus_ratio_times_advantage_with_the_reinforce_gradient():
    lp, inputs = lp_q_a()
    per_token = loss_fn("importance_sampling")(lp, inputs, {})
    assert per_token.tolist() == pytest.approx([-2.0, 1.0, 4.0])
    per_token.sum().backward()
    assert lp.grad.tolist() == pytest.approx([-2.0, 1.0, 4.0])  # -r * A: d(-r A)/d lp


def test_ppo_clips_the_ratio_to_its_bounds():
    lp, inputs = lp_q_a()
    # default bounds 0.8 / 1.2: token 0 (r=2, A>0) clipped at 1.2 and without gradient;
    # token 2 (r=2, A<0) keeps the unclipped, larger loss r*|A| = 4, with its gradient
    per_token = loss_fn("ppo")(lp, inputs, {})
    assert per_token.tolist() == pytest.approx([-1.2, 1.0, 4.0])
    per_token.sum().backward()
    assert lp.grad.tolist() == pytest.approx([0.0, 1.0, 4.0])
    lp, inputs = lp_q_a()
    wide = loss_fn("ppo")(lp, inputs, {"clip_low_threshold": 0.5, "clip_high_threshold": 3.0})
    assert wide.tolist() == pytest.approx([-2.0, 1.0, 4.0])
    per_token_bounds = {**inputs, "clip_low_threshold": torch.full((3,), 0.9),
                        "clip_high_threshold": torch.full((3,), 1.5)}  # fmt: skip
    assert loss_fn("ppo")(lp, per_token_bounds, {}).tolist() == pytest.approx([-1.5, 1.0, 4.0])


def test_cispo_weights_logprobs_by_the_clipped_ratio_without_its_gradient():
    lp, inputs = lp_q_a()
    per_token = loss_fn("cispo")(lp, inputs, {})
    weights = [1.2, 1.0, 1.2]
    assert per_token.tolist() == pytest.approx([-w * x * a for w, x, a in zip(weights, LP, A)])
    per_token.sum().backward()
    assert lp.grad.tolist() == pytest.approx([-w * a for w, a in zip(weights, A)])


def test_missing_inputs_bad_bounds_and_unserved_names_are_refused():
    lp = torch.tensor(LP)
    with pytest.raises(UserError, match="lacks advantages"):
        loss_fn("ppo")(lp, {"logprobs": torch.tensor(Q)}, {})
    with pytest.raises(UserError, match=r"has shape \[2\]; target_tokens has \[3\]"):
        loss_fn("cross_entropy")(lp, {"weights": torch.ones(2)}, {})
    _, inputs = lp_q_a()
    with pytest.raises(UserError, match="at most clip_high_threshold"):
        loss_fn("ppo")(lp, inputs, {"clip_low_threshold": 1.5, "clip_high_threshold": 1.2})
    for name in ("stable_reinforce", "dro", "no_such_loss"):
        with pytest.raises(UserError, match=", ".join(LOSSES)):
            loss_fn(name)
