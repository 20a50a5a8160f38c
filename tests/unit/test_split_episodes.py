"""An agent program's trajectory split by a prefix break: its earlier segment is a
sample of the same episode (rows, owners, padding) and gets the episode's advantage,
with the episode counted once in its group's statistics (hand-computed)."""

from __future__ import annotations

import math

import pytest
import torch

from rlpost.algos import AdvantageConfig, compute_advantages
from rlpost.data.samples import episode_rows, rollout_batch
from rlpost.rollout.base import Completion, GenerationResult

PAD = 0


def _c(prompt, ids, mask=None, segments=None) -> Completion:
    return Completion(
        token_ids=ids, logprobs=[-0.5] * len(ids), text="", finish_reason="stop",
        mask=mask, prompt_ids=prompt, segments=segments,
    )  # fmt: skip


def _results() -> list[GenerationResult]:
    # group 0: episode A (split: segment [5, 6] -> [7] before its last [8] -> [9, 10]),
    # episode B; group 1: episodes C, D
    a = _c([8], [9, 10], segments=[_c([5, 6], [7])])
    b = _c([8], [11])
    c = _c([3], [4, 4], mask=[1, 0])
    d = _c([3], [12])
    return [GenerationResult([8], [a, b]), GenerationResult([3], [c, d])]


def test_segments_follow_every_episode_row_in_their_group_and_pad_to_the_multiple():
    batch = rollout_batch(_results(), PAD, multiple=3)
    # 4 episodes, then A's segment, then one empty row: 6 splits over 3
    assert batch.owner_b.tolist() == [0, 1, 2, 3, 0, -1]
    assert batch.group_ids_b.tolist() == [0, 0, 1, 1, 0, 0]
    assert batch.input_ids_bt[4, :3].tolist() == [5, 6, 7]
    assert batch.response_mask_bt[4].tolist()[:3] == [0, 0, 1]
    assert batch.rollout_logp_bt[4].tolist()[:3] == [0.0, 0.0, -0.5]
    assert batch.response_mask_bt[5].sum() == 0 and batch.real_samples == 5
    scores = episode_rows(torch.tensor([1.0, 0.0, 0.5, 0.25]), batch)
    assert scores.tolist() == [1.0, 0.0, 0.5, 0.25, 1.0, 0.0]


def test_a_batch_without_splits_is_as_before():
    results = _results()
    results[0].completions[0].segments = None
    batch = rollout_batch(results, PAD, multiple=3)
    assert batch.owner_b is None and len(batch) == batch.real_samples == 4


def test_grpo_counts_the_split_episode_once_and_gives_its_segment_its_advantage():
    batch = rollout_batch(_results(), PAD, multiple=3)
    scores = {"total": episode_rows(torch.tensor([1.0, 0.0, 0.5, 0.25]), batch)}
    mask = batch.response_mask_bt.float()
    adv, _ = compute_advantages(
        AdvantageConfig(estimator="grpo"), scores_b=scores, group_ids_b=batch.group_ids_b,
        mask_bt=mask, owner_b=batch.owner_b,
    )  # fmt: skip
    # group 0 is {A: 1, B: 0} (not {1, 0, 1}): mean 0.5, unbiased std sqrt(0.5)
    s0 = 0.5 / (math.sqrt(0.5) + 1e-6)
    # group 1 is {C: 0.5, D: 0.25}: mean 0.375, std sqrt(0.03125)
    s1 = 0.125 / (math.sqrt(0.03125) + 1e-6)
    per_row = [s0, -s0, s1, -s1, s0, 0.0]
    expected = torch.tensor(per_row)[:, None] * mask
    assert torch.allclose(adv, expected, atol=1e-6)
    assert adv[4].sum() == pytest.approx(s0, abs=1e-6)  # the segment's one sampled token
    assert adv[2, 2] == 0  # C's environment token


def test_a_token_level_estimator_sees_each_segment_as_a_trajectory_of_its_own():
    batch = rollout_batch(_results(), PAD, multiple=3)
    scores = {"total": episode_rows(torch.tensor([1.0, 0.0, 0.5, 0.25]), batch)}
    mask = batch.response_mask_bt.float()
    cfg = AdvantageConfig(estimator="gae", gamma=1.0, lam=1.0)
    adv, returns = compute_advantages(
        cfg, scores_b=scores, group_ids_b=batch.group_ids_b, mask_bt=mask,
        values_bt=torch.zeros_like(mask), owner_b=batch.owner_b,
    )  # fmt: skip
    # with zero values, gamma = lambda = 1, the return of every response token is the
    # reward at its trajectory's end: the segment's token gets A's 1.0, padding 0
    assert returns[4, 2] == pytest.approx(1.0) and returns[5].abs().sum() == 0
    assert returns[0, 1] == pytest.approx(1.0) and returns[0, 2] == pytest.approx(1.0)
