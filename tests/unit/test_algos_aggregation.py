# Shapes: b = samples, t = tokens.
import pytest
import torch

from rlpost.algos import AGGREGATIONS, AdvantageConfig, LossNorm, PolicyLossConfig, aggregate

LOSS_BT = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK_BT = torch.tensor([[1, 1, 0], [1, 0, 0]])
NORM = LossNorm(global_tokens=3, global_samples=2, norm_const=4.0)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 7 / 3),  # (1 + 2 + 4) / 3 tokens = 2.3333
        ("seq-mean-token-sum", 3.5),  # ((1 + 2) + 4) / 2 samples = 3.5
        ("seq-mean-token-mean", 2.75),  # (3/2 + 4/1) / 2 = 5.5 / 2 = 2.75
        ("seq-mean-token-sum-norm", 0.875),  # 7 / (2 samples * 4) = 0.875
    ],
)
def test_aggregate_hand_values(mode, expected):
    assert aggregate(LOSS_BT, MASK_BT, mode, NORM).item() == pytest.approx(expected)


def test_empty_sample_counts_as_zero_in_seq_mean_token_mean():
    loss_bt = torch.tensor([[2.0, 4.0], [7.0, 7.0]])
    mask_bt = torch.tensor([[1, 1], [0, 0]])
    norm = LossNorm(global_tokens=2, global_samples=2)
    # (6/2 + 0/max(0,1)) / 2 = 1.5 -- the empty row neither divides by 0 nor adds 7s
    assert aggregate(loss_bt, mask_bt, "seq-mean-token-mean", norm).item() == pytest.approx(1.5)


def test_all_empty_global_batch_gives_zero_not_nan():
    norm = LossNorm(global_tokens=0, global_samples=1)
    out = aggregate(torch.ones(1, 3), torch.zeros(1, 3), "token-mean", norm)
    assert out.item() == 0.0  # 0 / max(0, 1)


@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_micro_batch_sum_equals_full_batch(mode):
    gen = torch.Generator().manual_seed(0)
    b, t = 7, 5
    base_bt = torch.randn(b, t, generator=gen)
    mask_bt = (torch.rand(b, t, generator=gen) > 0.3).long()
    mask_bt[3] = 0  # one sample without response tokens
    norm = LossNorm(global_tokens=float(mask_bt.sum()), global_samples=b, norm_const=t)

    full_bt = base_bt.clone().requires_grad_()
    full = aggregate(full_bt.square(), mask_bt, mode, norm)
    full.backward()

    split_bt = base_bt.clone().requires_grad_()
    total = torch.zeros(())
    for lo, hi in [(0, 2), (2, 6), (6, 7)]:  # uneven micro-batches 2 + 4 + 1
        total = total + aggregate(split_bt[lo:hi].square(), mask_bt[lo:hi], mode, norm)
    total.backward()

    torch.testing.assert_close(total, full)
    torch.testing.assert_close(split_bt.grad, full_bt.grad)


def test_unknown_mode_names_the_choices():
    with pytest.raises(KeyError, match="token-mean"):
        aggregate(LOSS_BT, MASK_BT, "mean", NORM)


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="differ"):
        aggregate(LOSS_BT, MASK_BT[:, :2], "token-mean", NORM)


def test_configs_report_every_bad_field_at_once():
    with pytest.raises(ValueError) as err:
        PolicyLossConfig(clip_low=1.5, clip_c=0.5)
    assert "clip_low=1.5" in str(err.value) and "clip_c=0.5" in str(err.value)
    with pytest.raises(ValueError, match="gamma=2"):
        AdvantageConfig(gamma=2.0)
    with pytest.raises(ValueError, match="global_samples=-1"):
        LossNorm(global_tokens=1, global_samples=-1)


def test_configs_are_frozen_and_hashable():
    cfg = AdvantageConfig(estimator="gdpo", reward_weights=(("acc", 1.0), ("fmt", 0.5)))
    assert hash(cfg) == hash(
        AdvantageConfig(estimator="gdpo", reward_weights=(("acc", 1.0), ("fmt", 0.5)))
    )
    with pytest.raises(AttributeError):
        cfg.eps = 1.0  # type: ignore[misc]
