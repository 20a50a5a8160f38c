"""Context parallelism's sequence layout (trainers/megatron/context_parallel.py); the
parity of a cp=2 engine with transformers and FSDP2 is in
tests/integration/test_megatron_engine.py and test_megatron_critic.py."""

import torch

from rlpost.trainers.megatron.context_parallel import gathered_positions, rank_positions


def test_each_rank_keeps_one_early_and_one_late_chunk():
    # 12 tokens, cp 3: six chunks of 2; rank r keeps chunks r and 5 - r
    assert rank_positions(12, 3, 0).tolist() == [0, 1, 10, 11]
    assert rank_positions(12, 3, 1).tolist() == [2, 3, 8, 9]
    assert rank_positions(12, 3, 2).tolist() == [4, 5, 6, 7]
    # causal work per rank: keys visible to its queries (position p sees p + 1)
    work = [sum(p + 1 for p in rank_positions(12, 3, r).tolist()) for r in range(3)]
    assert work == [26, 26, 26]


def test_gathered_rows_cover_the_sequence_once():
    for seq, cp in [(4, 1), (8, 2), (24, 3), (16, 4)]:
        pos = gathered_positions(seq, cp)
        assert torch.equal(pos.sort().values, torch.arange(seq))
        # argsort of the gathered positions restores sequence order
        assert torch.equal(pos[torch.argsort(pos)], torch.arange(seq))
