# Shapes: b = samples, t = tokens.
import math

import pytest
import torch

from rlpost.algos import (
    ADVANTAGE_ESTIMATORS,
    AdvantageConfig,
    compute_advantages,
    gdpo_advantage,
    grpo_advantage,
    last_token_rewards,
    register_advantage,
    reinforce_pp_baseline_advantage,
    rloo_advantage,
)

SCORES_B = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 5.0])
GROUPS_B = torch.tensor([0, 0, 0, 0, 1, 1, 2])
SQRT3 = math.sqrt(3)


def test_grpo_hand_values():
    adv_b = grpo_advantage(SCORES_B, GROUPS_B)
    # group 0: mean 0.5, unbiased var = 4 * 0.25 / 3 = 1/3, std = 0.57735 -> +-0.5/0.57735 = +-0.866
    # group 1: equal scores -> 0 / (0 + eps) = 0 ; group 2: a group of one -> 0
    expected = torch.tensor([SQRT3 / 2, -SQRT3 / 2, -SQRT3 / 2, SQRT3 / 2, 0.0, 0.0, 0.0])
    torch.testing.assert_close(adv_b, expected, atol=1e-5, rtol=0)


def test_dr_grpo_skips_std():
    adv_b = grpo_advantage(SCORES_B, GROUPS_B, norm_by_std=False)
    # s - mean_g: 1 - 0.5, 0 - 0.5, ..., 2 - 2, 5 - 5
    torch.testing.assert_close(adv_b, torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0]))


def test_grpo_matches_naive_loop_with_string_group_ids():
    gen = torch.Generator().manual_seed(3)
    scores_b = torch.randn(12, generator=gen)
    ids = ["a", "b", "c", "a", "b", "c", "a", "b", "c", "a", "d", "d"]  # uneven group sizes
    adv_b = grpo_advantage(scores_b, ids, eps=1e-6)
    for gid in set(ids):
        rows = [i for i, x in enumerate(ids) if x == gid]
        s = scores_b[rows]
        torch.testing.assert_close(adv_b[rows], (s - s.mean()) / (s.std() + 1e-6))


def test_rloo_hand_values():
    scores_b = torch.tensor([1.0, 2.0, 3.0, 4.0])
    adv_b = rloo_advantage(scores_b, torch.tensor([0, 0, 0, 1]))
    # 1 - (2+3)/2 = -1.5 ; 2 - (1+3)/2 = 0 ; 3 - (1+2)/2 = 1.5 ; group of one -> 0
    torch.testing.assert_close(adv_b, torch.tensor([-1.5, 0.0, 1.5, 0.0]))


def test_reinforce_pp_baseline_hand_values():
    mask_bt = torch.tensor([[1, 1], [1, 0], [1, 1]])
    adv_bt = reinforce_pp_baseline_advantage(torch.tensor([1.0, 0.0, 3.0]), [0, 0, 1], mask_bt)
    # s - mean_g = [0.5, -0.5, 0] -> tokens [0.5, 0.5, -0.5, 0, 0], mean 0.1,
    # deviations [0.4, 0.4, -0.6, -0.1, -0.1], unbiased var = 0.7 / 4 = 0.175, std 0.418330;
    # group 1 is a single sample: centred to exactly 0, then whitened with the batch.
    std = math.sqrt(0.175)
    expected = torch.tensor([[0.4, 0.4], [-0.6, 0.0], [-0.1, -0.1]]) / std
    torch.testing.assert_close(adv_bt, expected, atol=1e-5, rtol=0)


def test_reinforce_pp_baseline_whitens_a_uniform_group_with_the_batch():
    # Hu 2025, sec. 3.3: centre within the group, then whiten over the batch's tokens.
    # 12 samples in 3 groups of 4; group 2 all scored 1 (uniform).
    scores_b = torch.tensor([1.0, 0, 0, 0] + [1.0, 1, 0, 1] + [1.0, 1, 1, 1])
    groups_b = torch.tensor([0] * 4 + [1] * 4 + [2] * 4)
    mask_bt = torch.zeros(12, 3)
    mask_bt[:, 0] = 1
    mask_bt[0] = 1  # sample 0 has 3 response tokens, every other sample 1
    adv_bt = reinforce_pp_baseline_advantage(scores_b, groups_b, mask_bt)
    # centred: group 0 mean 0.25 -> [0.75, -0.25, -0.25, -0.25]
    #          group 1 mean 0.75 -> [0.25, 0.25, -0.75, 0.25] ; group 2 -> exactly [0, 0, 0, 0]
    # tokens: 0.75 x 3, -0.25 x 3 | 0.25 x 3, -0.75 | 0 x 4 -> N = 14, sum 1.5
    # mean = 1.5 / 14 = 3/28 = 0.107143 ; sum x^2 = 3 * 0.5625 + 3 * 0.0625 + 3 * 0.0625
    #   + 0.5625 = 2.625 ; unbiased var = (2.625 - 14 * (3/28)^2) / 13 = 69/364 = 0.189560,
    #   std = 0.435385
    # group 2: (0 - 0.107143) / 0.435385 = -0.246087 on each token, not 0;
    # sample 0: (0.75 - 0.107143) / 0.435385 = 1.476524
    mean, std = 3 / 28, math.sqrt(69 / 364)
    torch.testing.assert_close(adv_bt[8:, 0], torch.full((4,), -mean / std), atol=1e-5, rtol=0)
    assert adv_bt[8, 0].item() == pytest.approx(-0.246087, abs=1e-5)
    torch.testing.assert_close(adv_bt[0], torch.full((3,), (0.75 - mean) / std), atol=1e-5, rtol=0)
    torch.testing.assert_close(adv_bt[6, 0], torch.tensor((-0.75 - mean) / std), atol=1e-5, rtol=0)
    assert adv_bt[1:, 1:].abs().sum() == 0  # nothing off the response tokens
    # reference: (s - mean_g) broadcast, whitened with torch.std over the response tokens
    centred_bt = (scores_b - torch.tensor([0.25] * 4 + [0.75] * 4 + [1.0] * 4))[:, None] * mask_bt
    tokens = centred_bt[mask_bt.bool()]
    ref_bt = (centred_bt - tokens.mean()) / tokens.std() * mask_bt
    torch.testing.assert_close(adv_bt, ref_bt, atol=1e-5, rtol=0)


def test_gdpo_normalises_each_reward_then_the_batch():
    scores = {"acc": torch.tensor([1.0, 0.0, 1.0, 1.0]), "fmt": torch.tensor([0.0, 1.0, 0.0, 1.0])}
    adv_b = gdpo_advantage(scores, [0, 0, 1, 1], {"acc": 1.0, "fmt": 0.5})
    # acc per group: [+0.7071, -0.7071 | 0, 0] ; fmt: [-0.7071, +0.7071 | -0.7071, +0.7071]
    # acc + 0.5 fmt = [0.35355, -0.35355, -0.35355, 0.35355]; mean 0,
    # unbiased std = sqrt(4 * 0.125 / 3) = 0.408248 -> +-0.35355 / 0.408248 = +-0.866025
    expected = torch.tensor([1.0, -1.0, -1.0, 1.0]) * SQRT3 / 2
    torch.testing.assert_close(adv_b, expected, atol=1e-5, rtol=0)


def test_gdpo_unknown_reward_name():
    with pytest.raises(KeyError, match="length"):
        gdpo_advantage({"acc": torch.ones(2)}, [0, 0], {"length": 1.0})


def test_last_token_rewards():
    mask_bt = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 1]])
    rewards_bt = last_token_rewards(torch.tensor([2.0, 3.0, 4.0]), mask_bt)
    # each score on the last mask-1 token; an empty response gets nothing
    torch.testing.assert_close(rewards_bt, torch.tensor([[0.0, 2, 0], [0, 0, 0], [0, 0, 4]]))


def test_compute_advantages_broadcasts_grpo_over_the_mask():
    mask_bt = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv_bt, returns_bt = compute_advantages(
        AdvantageConfig(),
        scores_b={"total": torch.tensor([1.0, 0.0])},
        group_ids_b=[7, 7],
        mask_bt=mask_bt,
    )
    # group [1, 0]: mean 0.5, std 0.70711 -> +-0.70711, zero on non-response tokens
    a = 0.5 / math.sqrt(0.5)
    torch.testing.assert_close(
        adv_bt, torch.tensor([[a, a, 0.0], [-a, 0.0, 0.0]]), atol=1e-5, rtol=0
    )
    assert returns_bt is None


def test_compute_advantages_reinforce_pp_places_score_on_last_token():
    mask_bt = torch.tensor([[1, 1, 0], [1, 1, 1]])
    cfg = AdvantageConfig(estimator="reinforce_pp", gamma=0.5)
    adv_bt, _ = compute_advantages(
        cfg, scores_b={"total": torch.tensor([1.0, 2.0])}, group_ids_b=[0, 1], mask_bt=mask_bt
    )
    # returns-to-go: [0.5, 1 | 0.5, 1, 2]; mean 1, deviations [-0.5, 0, -0.5, 0, 1],
    # unbiased var = 1.5 / 4 = 0.375
    expected = torch.tensor([[-0.5, 0.0, 0.0], [-0.5, 0.0, 1.0]]) / math.sqrt(0.375)
    torch.testing.assert_close(adv_bt, expected, atol=1e-5, rtol=0)


def test_compute_advantages_gdpo_uses_reward_weights():
    scores = {"acc": torch.tensor([1.0, 0.0, 1.0, 1.0]), "fmt": torch.tensor([0.0, 1.0, 0.0, 1.0])}
    cfg = AdvantageConfig(estimator="gdpo", reward_weights=(("acc", 1.0), ("fmt", 0.5)))
    adv_bt, _ = compute_advantages(
        cfg, scores_b=scores, group_ids_b=[0, 0, 1, 1], mask_bt=torch.ones(4, 2)
    )
    expected_b = gdpo_advantage(scores, [0, 0, 1, 1], {"acc": 1.0, "fmt": 0.5})
    torch.testing.assert_close(adv_bt, expected_b[:, None].expand(4, 2))


def test_compute_advantages_errors_say_what_to_change():
    mask_bt = torch.ones(2, 2)
    with pytest.raises(KeyError, match="'total'"):
        compute_advantages(
            AdvantageConfig(), scores_b={"acc": torch.ones(2)}, group_ids_b=[0, 0], mask_bt=mask_bt
        )
    with pytest.raises(KeyError, match="grpo"):
        compute_advantages(
            AdvantageConfig(estimator="ppo"), scores_b={}, group_ids_b=[0, 0], mask_bt=mask_bt
        )
    with pytest.raises(ValueError, match="values_bt"):
        compute_advantages(
            AdvantageConfig(estimator="gae"),
            scores_b={"total": torch.ones(2)},
            group_ids_b=[0, 0],
            mask_bt=mask_bt,
        )
    with pytest.raises(ValueError, match="only a total: return a dict of named rewards"):
        compute_advantages(
            AdvantageConfig(estimator="gdpo"),
            scores_b={"total": torch.ones(2)},
            group_ids_b=[0, 0],
            mask_bt=mask_bt,
        )


def test_gdpo_weighs_a_named_reward_the_weights_leave_out_at_one():
    # Two groups of two; 'fmt' is not in the weights, so it counts 1.0 as in the total.
    scores = {
        "acc": torch.tensor([1.0, 0.0, 0.0, 1.0]),
        "fmt": torch.tensor([1.0, 1.0, 0.0, 1.0]),
        "total": torch.zeros(4),
    }
    mask_bt, groups = torch.ones(4, 2), [0, 0, 1, 1]

    def adv(weights):
        cfg = AdvantageConfig(estimator="gdpo", reward_weights=weights)
        return compute_advantages(cfg, scores_b=scores, group_ids_b=groups, mask_bt=mask_bt)[0]

    both_at_one = adv((("acc", 1.0), ("fmt", 1.0)))
    torch.testing.assert_close(adv(()), both_at_one)
    torch.testing.assert_close(adv((("acc", 1.0),)), both_at_one)
    assert not torch.allclose(adv((("fmt", 0.5),)), both_at_one)  # a given weight counts


def test_register_advantage():
    assert set(ADVANTAGE_ESTIMATORS) >= {
        "grpo",
        "rloo",
        "reinforce_pp",
        "reinforce_pp_baseline",
        "gae",
        "gdpo",
    }
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("grpo")(lambda cfg, **kw: None)
    try:

        @register_advantage("constant")
        def _constant(cfg, *, mask_bt, **_):
            return 2.0 * mask_bt, None

        adv_bt, _ = compute_advantages(
            AdvantageConfig(estimator="constant"),
            scores_b={},
            group_ids_b=[0],
            mask_bt=torch.ones(1, 2),
        )
        torch.testing.assert_close(adv_bt, torch.full((1, 2), 2.0))
    finally:
        ADVANTAGE_ESTIMATORS.pop("constant", None)


def test_equal_rewards_give_exactly_zero_advantage_in_every_group_estimator():
    # 0.7 is not exact in float32: 8 * 0.7 / 8 != 0.7 there, and that noise divided by
    # std + eps = 1e-6 was a non-zero advantage. Group 0 all 0.7 (no signal), group 1 mixed.
    scores_b = torch.tensor([0.7] * 8 + [0.0, 1.0, 0.3, 0.7, 0.1, 0.9, 0.2, 0.6])
    groups_b = torch.tensor([0] * 8 + [1] * 8)
    mask_bt = torch.ones(16, 3)
    named = {"total": scores_b, "a": scores_b, "b": torch.full((16,), 0.7)}
    for estimator in ("grpo", "rloo", "reinforce_pp_baseline", "gdpo"):
        for norm_by_std in (True, False):  # False: Dr.GRPO
            cfg = AdvantageConfig(
                estimator=estimator,
                norm_by_std=norm_by_std,
                reward_weights=(("a", 1.0), ("b", 0.5)),
            )
            adv_bt, _ = compute_advantages(
                cfg, scores_b=named, group_ids_b=groups_b, mask_bt=mask_bt
            )
            if estimator == "reinforce_pp_baseline":
                # centred to exactly 0, then whitened with the batch: one shared value,
                # -mean/std, and the mean is ~0 here (equal lengths, centred groups)
                assert torch.equal(adv_bt[:8], adv_bt[:8].flatten()[0].expand(8, 3))
                assert adv_bt[:8].abs().max() < 1e-6, adv_bt[:8]
            else:
                assert torch.equal(adv_bt[:8], torch.zeros(8, 3)), (estimator, adv_bt[:8])
            assert adv_bt[8:].abs().sum() > 0, estimator  # the mixed group still learns
