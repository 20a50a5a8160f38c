"""Generations and SFT rows -> padded ``TrajectoryBatch``; batch row/column selection.

Shapes: b = samples, t = tokens.
"""

import pytest
import torch

from rlpost.data.samples import rollout_batch, sft_batch
from rlpost.models.tiny import build_tokenizer
from rlpost.rollout.base import Completion, GenerationResult
from rlpost.trainers.batch import TrajectoryBatch, pad_sequences

PAD = 3


def _completion(ids: list[int], logps: list[float]) -> Completion:
    return Completion(token_ids=ids, logprobs=logps, text="", finish_reason="stop")


def _results() -> list[GenerationResult]:
    # prompt 0: 3 tokens, completions of 2 and 1 tokens -> rows of 5 and 4
    # prompt 1: 2 tokens, completions of 3 and 4 tokens -> rows of 5 and 6 (the width)
    return [
        GenerationResult(
            prompt_ids=[10, 11, 12],
            completions=[_completion([20, 21], [-0.1, -0.2]), _completion([22], [-0.3])],
        ),
        GenerationResult(
            prompt_ids=[13, 14],
            completions=[
                _completion([23, 24, 25], [-0.4, -0.5, -0.6]),
                _completion([26, 27, 28, 29], [-0.7, -0.8, -0.9, -1.0]),
            ],
        ),
    ]


def test_rollout_batch_layout():
    batch = rollout_batch(_results(), pad_id=PAD)
    assert len(batch) == 4
    assert batch.input_ids_bt.dtype == torch.long
    assert batch.input_ids_bt.tolist() == [
        [10, 11, 12, 20, 21, PAD],
        [10, 11, 12, 22, PAD, PAD],
        [13, 14, 23, 24, 25, PAD],
        [13, 14, 26, 27, 28, 29],
    ]
    assert batch.attention_mask_bt.tolist() == [
        [1, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1, 1],
    ]
    assert batch.response_mask_bt.tolist() == [
        [0, 0, 0, 1, 1, 0],
        [0, 0, 0, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 1, 1, 1, 1],
    ]
    # position t holds log p(token_t | tokens_<t): the completion's log-probs sit
    # on the completion's own tokens, 0 on prompt and padding
    expected_logp = torch.tensor(
        [
            [0.0, 0.0, 0.0, -0.1, -0.2, 0.0],
            [0.0, 0.0, 0.0, -0.3, 0.0, 0.0],
            [0.0, 0.0, -0.4, -0.5, -0.6, 0.0],
            [0.0, 0.0, -0.7, -0.8, -0.9, -1.0],
        ]
    )
    assert batch.rollout_logp_bt is not None
    assert batch.rollout_logp_bt.dtype == torch.float32
    torch.testing.assert_close(batch.rollout_logp_bt, expected_logp, rtol=0, atol=0)
    assert batch.group_ids_b is not None
    assert batch.group_ids_b.tolist() == [0, 0, 1, 1]
    assert batch.old_logp_bt is None and batch.advantages_bt is None


def test_sft_batch_masks_exactly_the_response_and_end_token():
    tok = build_tokenizer()
    rows = [{"prompt": "1+2=", "response": "3"}, {"prompt": "10+20=", "response": "30"}]
    batch = sft_batch(tok, rows)
    assert batch.rollout_logp_bt is None
    lengths = batch.attention_mask_bt.sum(dim=1).tolist()
    assert max(lengths) == batch.input_ids_bt.shape[1]
    for i, row in enumerate(rows):
        ids = batch.input_ids_bt[i].tolist()
        mask = batch.response_mask_bt[i].tolist()
        length = lengths[i]
        n_resp = len(row["response"]) + 1  # one token per character, then <|end|>
        # attention: a prefix of ones; padding is the pad token
        assert batch.attention_mask_bt[i].tolist() == [1] * length + [0] * (len(ids) - length)
        assert ids[length:] == [tok.pad_token_id] * (len(ids) - length)
        # the response mask is the last n_resp real tokens, nothing else
        assert mask == [0] * (length - n_resp) + [1] * n_resp + [0] * (len(ids) - length)
        response_ids = ids[length - n_resp : length]
        assert response_ids[-1] == tok.eos_token_id
        assert tok.decode(response_ids) == row["response"] + "<|end|>"
        prompt_text = tok.decode(ids[: length - n_resp])
        assert prompt_text.endswith(f"<|user|>{row['prompt']}<|end|><|assistant|>")


def _batch() -> TrajectoryBatch:
    # 4 rows, width 6, longest row 4 tokens: two all-padding columns at the end
    ids = pad_sequences([[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]], pad_id=0)
    ids = torch.cat([ids, torch.zeros(4, 2, dtype=torch.long)], dim=1)
    attn = (ids > 0).long()
    resp = attn.clone()
    resp[:, 0] = 0
    logp = -ids.float() / 10 * resp
    return TrajectoryBatch(
        input_ids_bt=ids,
        attention_mask_bt=attn,
        response_mask_bt=resp,
        rollout_logp_bt=logp,
        advantages_bt=torch.arange(4.0)[:, None] * resp,
        scores_b={"correctness": torch.tensor([1.0, 0.0, 1.0, 0.5])},
        group_ids_b=torch.tensor([0, 0, 1, 1]),
    )


def test_select_takes_the_same_rows_of_every_field():
    batch = _batch()
    sub = batch.select(torch.tensor([2, 0]))
    assert sub.input_ids_bt.tolist() == [[6, 7, 8, 9, 0, 0], [1, 2, 3, 0, 0, 0]]
    assert sub.attention_mask_bt.tolist() == [[1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]]
    assert sub.response_mask_bt.tolist() == [[0, 1, 1, 1, 0, 0], [0, 1, 1, 0, 0, 0]]
    torch.testing.assert_close(sub.rollout_logp_bt, batch.rollout_logp_bt[[2, 0]])
    assert sub.advantages_bt[:, 1].tolist() == [2.0, 0.0]
    assert sub.scores_b["correctness"].tolist() == [1.0, 1.0]
    assert sub.group_ids_b.tolist() == [1, 0]
    assert sub.old_logp_bt is None and sub.ref_logp_bt is None
    assert len(batch) == 4  # the source is untouched


def test_trim_drops_only_all_padding_columns():
    batch = _batch()
    trimmed = batch.trim()
    # longest row has 4 tokens: width 6 -> 4
    assert trimmed.input_ids_bt.tolist() == [
        [1, 2, 3, 0],
        [4, 5, 0, 0],
        [6, 7, 8, 9],
        [10, 0, 0, 0],
    ]
    for name, value in trimmed.tensor_fields().items():
        if value.dim() == 2:
            assert value.shape == (4, 4), name
            torch.testing.assert_close(value, getattr(batch, name)[:, :4])
    assert trimmed.group_ids_b.tolist() == [0, 0, 1, 1]
    assert trimmed.scores_b["correctness"].tolist() == [1.0, 0.0, 1.0, 0.5]
    # a sub-batch of short rows trims further: rows 1 and 3 have 2 and 1 tokens
    assert batch.select(torch.tensor([1, 3])).trim().input_ids_bt.tolist() == [[4, 5], [10, 0]]


def test_shard_gives_contiguous_equal_shares():
    batch = _batch()
    first, second = batch.shard(0, 2), batch.shard(1, 2)
    assert first.group_ids_b.tolist() == [0, 0]
    assert second.group_ids_b.tolist() == [1, 1]
    assert second.input_ids_bt[:, :4].tolist() == [[6, 7, 8, 9], [10, 0, 0, 0]]
    assert second.scores_b["correctness"].tolist() == [1.0, 0.5]
    assert torch.equal(torch.cat([first.input_ids_bt, second.input_ids_bt]), batch.input_ids_bt)
    assert [b.input_ids_bt[0, 0].item() for b in (batch.shard(r, 4) for r in range(4))] == [
        1,
        4,
        6,
        10,
    ]
    with pytest.raises(ValueError, match="4 samples does not split over 3 ranks"):
        batch.shard(0, 3)
