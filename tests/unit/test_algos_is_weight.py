"""Truncated importance weight for stale or mismatched rollout log-probs."""

import math

import torch

from rlpost.algos import truncated_is_weight


def test_truncated_is_weight_by_hand():
    # log ratios old - rollout: 0, ln 1.5, ln 3 (capped to 2), and a masked token
    old = torch.tensor([[0.0, math.log(1.5), math.log(3.0), 5.0]])
    rollout = torch.zeros(1, 4)
    mask = torch.tensor([[1, 1, 1, 0]])
    w, metrics = truncated_is_weight(old, rollout, mask, cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.5, 2.0, 0.0]]))
    # mean over the 3 mask tokens: (1 + 1.5 + 2) / 3 = 1.5; one of three capped
    assert math.isclose(metrics["rollout/is_weight_mean"], 1.5, rel_tol=1e-6)
    assert math.isclose(metrics["rollout/is_capped_frac"], 1 / 3, rel_tol=1e-6)


def test_on_policy_samples_get_unit_weights():
    logp = torch.randn(3, 5)
    w, metrics = truncated_is_weight(logp, logp.clone(), torch.ones(3, 5), cap=2.0)
    torch.testing.assert_close(w, torch.ones(3, 5))
    assert metrics["rollout/is_capped_frac"] == 0.0
