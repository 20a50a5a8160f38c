# Shapes: b = samples.
import pytest
import torch

from rlpost.algos import overlong_penalty, zero_std_groups


def test_overlong_penalty_hand_values():
    lengths_b = torch.tensor([10, 80, 90, 100, 101])
    penalty_b = overlong_penalty(lengths_b, max_len=100, buffer=20)
    # buffer starts at 100 - 20 = 80: 10 -> 0 ; 80 -> 0 ; 90 -> (80-90)/20 = -0.5 ;
    # 100 -> (80-100)/20 = -1 ; 101 > max_len -> -1
    torch.testing.assert_close(penalty_b, torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]))


def test_overlong_penalty_rejects_bad_buffer():
    with pytest.raises(ValueError, match="buffer=0"):
        overlong_penalty(torch.tensor([1]), max_len=10, buffer=0)


def test_zero_std_groups():
    scores_b = torch.tensor([1.0, 1.0, 0.0, 1.0, 5.0, 0.3, 0.3, 0.3])
    keep_b = zero_std_groups(scores_b, [0, 0, 1, 1, 2, 3, 3, 3])
    # group 0 all 1 -> drop ; group 1 mixed -> keep ; group 2 single -> drop ; group 3 equal -> drop
    assert keep_b.tolist() == [False, False, True, True, False, False, False, False]
