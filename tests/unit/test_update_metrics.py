"""A step's metrics are read from the device once: every loss hands back 0-d tensors,
and ``MetricSums`` adds them where they live until the step ends.

Shapes: b = samples, t = tokens, p = pairs.
"""

from __future__ import annotations

import pytest
import torch

from rlpost.algos import (
    OFF_POLICY,
    POLICY_LOSSES,
    PREFERENCE_LOSSES,
    LossNorm,
    OffPolicyConfig,
    PolicyLossConfig,
    PreferenceConfig,
    bradley_terry_loss,
    clipped_value_loss,
    sft_loss,
)
from rlpost.trainers.update import LOSS, MetricSums

NORM = LossNorm(global_tokens=6, global_samples=2)


def _case() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    logp_bt = (-torch.rand(2, 4, generator=g)).requires_grad_()
    old_bt = logp_bt.detach() + 0.3 * torch.randn(2, 4, generator=g)
    adv_bt = torch.randn(2, 1, generator=g).expand(2, 4).contiguous()
    mask_bt = torch.tensor([[0.0, 1, 1, 1], [0, 1, 1, 1]])
    return logp_bt, old_bt, adv_bt, mask_bt


def _assert_tensors(metrics: dict) -> None:
    assert metrics, "no metrics"
    for key, value in metrics.items():
        # a float here would have waited for the device inside the loss
        assert isinstance(value, torch.Tensor) and value.dim() == 0, key
        assert not value.requires_grad, key


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_every_policy_loss_hands_back_tensors(name):
    logp_bt, old_bt, adv_bt, mask_bt = _case()
    agg = "seq-mean-token-mean" if name == "gspo" else "token-mean"
    _, metrics = POLICY_LOSSES[name](
        logp_bt, old_bt, adv_bt, mask_bt, PolicyLossConfig(name, agg=agg), NORM
    )
    _assert_tensors(metrics)


@pytest.mark.parametrize("name", sorted(OFF_POLICY))
def test_every_off_policy_correction_hands_back_tensors(name):
    logp_bt, old_bt, adv_bt, mask_bt = _case()
    rollout_bt = old_bt + 0.05
    cfg = (
        OffPolicyConfig(name, lo=0.5, hi=2.0)
        if name in ("icepop", "mis")
        else OffPolicyConfig(name)
    )
    _, metrics = OFF_POLICY[name](logp_bt, old_bt, rollout_bt, mask_bt, adv_bt, cfg)
    _assert_tensors(metrics)


@pytest.mark.parametrize("name", sorted(PREFERENCE_LOSSES))
def test_every_preference_loss_hands_back_tensors(name):
    g = torch.Generator().manual_seed(1)
    chosen_p, rejected_p, ref_c, ref_r = (-torch.rand(3, generator=g) for _ in range(4))
    _, metrics = PREFERENCE_LOSSES[name].fn(
        chosen_p, rejected_p, ref_c, ref_r, PreferenceConfig(loss=name), 3
    )
    _assert_tensors(metrics)


def test_value_sft_and_reward_model_losses_hand_back_tensors():
    logp_bt, old_bt, _, mask_bt = _case()
    _assert_tensors(sft_loss(logp_bt, mask_bt, NORM)[1])
    values_bt = logp_bt.detach().clone().requires_grad_()
    _assert_tensors(
        clipped_value_loss(
            values_bt, old_bt, -old_bt, mask_bt, clip=0.2, agg="token-mean", norm=NORM
        )[1]
    )
    _assert_tensors(bradley_terry_loss(torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5]), 2)[1])


def test_sums_add_tensors_and_floats_by_their_weights():
    sums = MetricSums()
    # micro-batch 1, 3 response tokens: mean 0.5 -> 1.5; micro-batch 2, 2 tokens: 0.25 -> 0.5
    sums.add("actor/ratio_mean", torch.tensor(0.5, dtype=torch.float32), 3.0)
    sums.add("actor/ratio_mean", torch.tensor(0.25), 2.0)
    # a float from a user's own loss: 2 x 1.0 + 1 x 4.0 = 6.0
    sums.add("user/score", 1.0, 2.0)
    sums.add("user/score", 4.0)
    sums.add(LOSS, torch.tensor(0.125))
    sums.add(LOSS, torch.tensor(-0.5))
    assert sums.keys() == sorted(["actor/ratio_mean", "user/score", LOSS])
    vector = sums.vector(["user/score", "never/added", "actor/ratio_mean", LOSS])
    assert vector.dtype == torch.float64
    # 1.5 + 0.5 = 2.0; never added: 0; the loss 0.125 - 0.5 = -0.375
    assert vector.tolist() == [6.0, 0.0, 2.0, -0.375]
