"""Preference rows in TRL's formats, parsed into one form, and the pairwise batch."""

import pytest

from rlpost.config import compose
from rlpost.config.schema import ConfigError
from rlpost.data.preference import (
    near_miss_pairs,
    parse_preference_row,
    parse_preference_rows,
    preference_batch,
    sampled_pairs,
)
from rlpost.data.rows import DataError
from rlpost.data.tasks.arith import answer_text, correctness, near_misses
from rlpost.models.tiny import build_tokenizer

USER = [{"role": "user", "content": "2+2="}]


def _assistant(text):
    return [{"role": "assistant", "content": text}]


def test_plain_text_with_explicit_prompt():
    row = parse_preference_row({"prompt": "2+2=", "chosen": "4", "rejected": "5", "id": 7})
    assert row["prompt"] == USER
    assert row["chosen"] == _assistant("4") and row["rejected"] == _assistant("5")
    assert row["id"] == 7  # other columns are kept


def test_conversational_with_explicit_prompt():
    row = parse_preference_row(
        {"prompt": USER, "chosen": _assistant("4"), "rejected": _assistant("5"), "margin": 1.5}
    )
    assert row["prompt"] == USER and row["chosen"] == _assistant("4")
    assert row["margin"] == 1.5


def test_implicit_prompt_is_the_shared_prefix():
    history = [*USER, *_assistant("4"), {"role": "user", "content": "twice?"}]
    row = parse_preference_row(
        {"chosen": [*history, *_assistant("8")], "rejected": [*history, *_assistant("9")]}
    )
    assert row["prompt"] == history  # an earlier assistant turn stays in the prompt
    assert row["chosen"] == _assistant("8") and row["rejected"] == _assistant("9")


def test_implicit_prompt_of_texts_cuts_at_a_space():
    # as TRL's extract_prompt: "The sky is" + " blue." / " green."
    row = parse_preference_row({"chosen": "The sky is blue.", "rejected": "The sky is green."})
    assert row["prompt"] == [{"role": "user", "content": "The sky is"}]
    assert row["chosen"] == _assistant(" blue.")


@pytest.mark.parametrize(
    "bad, why",
    [
        ({"prompt": "2+2=", "chosen": "4"}, "no 'chosen' and 'rejected'"),
        ({"chosen": "abc", "rejected": "xyz"}, "share no prefix"),
        ({"prompt": "2+2=", "chosen": "4", "rejected": "4"}, "same completion"),
        ({"prompt": "2+2=", "chosen": 4, "rejected": "5"}, "'chosen' must be a string"),
        ({"chosen": "4", "rejected": _assistant("5")}, "both be texts or both"),
        ({"prompt": "", "chosen": "4", "rejected": "5"}, "empty string"),
        ({"prompt": "x", "chosen": "4", "rejected": "5", "margin": "big"}, "'margin'"),
    ],
)
def test_bad_rows_say_why(bad, why):
    with pytest.raises(ValueError, match=why):
        parse_preference_row(bad)


def test_rows_without_pair_columns_name_the_columns_found():
    with pytest.raises(DataError, match=r"columns found are \['answer', 'prompt'\]"):
        parse_preference_rows([{"prompt": "1+1=", "answer": "2"}], "data.train_files: x.jsonl")
    kept, reasons = parse_preference_rows(
        [
            {"prompt": "a", "chosen": "1", "rejected": "2"},
            {"prompt": "a", "chosen": "1", "rejected": "1"},
        ],
        "f",
    )
    assert len(kept) == 1 and reasons[0].startswith("row 1:")


def test_preference_batch_interleaves_pairs_and_masks_the_completion():
    tok = build_tokenizer()
    rows = [
        parse_preference_row({"prompt": "2+2=", "chosen": "4", "rejected": "15", "margin": 2.0}),
        parse_preference_row({"prompt": "1+1=", "chosen": "2", "rejected": "3"}),
    ]
    batch = preference_batch(tok, rows)
    assert batch.group_ids_b.tolist() == [0, 0, 1, 1]
    assert batch.scores_b["margin"].tolist() == [2.0, 2.0, 0.0, 0.0]
    # "<|user|>2+2=<|end|><|assistant|>" is 7 tokens; the target "4<|end|>" is 2
    chosen = tok.decode(batch.input_ids_bt[0][batch.attention_mask_bt[0].bool()])
    assert chosen == "<|user|>2+2=<|end|><|assistant|>4<|end|>"
    assert batch.response_mask_bt[0].tolist()[:9] == [0] * 7 + [1, 1]
    masked = batch.input_ids_bt[1][batch.response_mask_bt[1].bool()]
    assert tok.decode(masked) == "15<|end|>"


def test_sampled_pairs_reject_the_first_wrong_sample():
    row = {"prompt": [{"role": "user", "content": "2+3="}], "answer": "5"}
    right = {"prompt": [{"role": "user", "content": "1+1="}], "answer": "2"}
    pairs = sampled_pairs([row, right], [["5", "6", "7"], ["2", "2"]], correctness, answer_text)
    assert len(pairs) == 1  # every sample of 1+1= was right: no pair
    assert pairs[0]["chosen"] == _assistant("5") and pairs[0]["rejected"] == _assistant("6")


def test_near_misses_of_a_sum():
    # 146: +-1, +-10, +-20, +-100, rounded down to tens, 100, the other prompt's 58
    assert near_misses("146", "58") == [
        "147", "145", "156", "136", "166", "126", "246", "46", "140", "100", "58",
    ]  # fmt: skip
    # 9: none below zero, the sum itself (other = 9) and repeats (100 twice) left out
    assert near_misses("9", "9") == ["10", "8", "19", "29", "109", "0", "100"]


def test_near_miss_pairs_take_the_next_rows_answer_as_the_other():
    rows = [
        {"prompt": [{"role": "user", "content": "2+3="}], "answer": "5"},
        {"prompt": [{"role": "user", "content": "60+40="}], "answer": "100"},
    ]
    pairs = near_miss_pairs(rows, lambda answer, other: [other])
    assert [(p["chosen"], p["rejected"]) for p in pairs] == [
        (_assistant("5"), _assistant("100")),
        (_assistant("100"), _assistant("5")),
    ]
    assert pairs[1]["prompt"] == rows[1]["prompt"]
    # 5: 6 4 15 25 105 0 100 (-5, -15, -95 below zero; 100 twice); 100: 101 99 110 90
    # 120 80 200 0 5 (rounded down and 100 are the sum itself)
    assert len(near_miss_pairs(rows, near_misses)) == 7 + 9


def test_offline_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"rollout\.n=4: algo=dpo trains offline"):
        compose(["algo=dpo", "data=arith_pref", "rollout.n=4"])
    with pytest.raises(ConfigError, match=r"algo\.dpo\.label_smoothing=0\.1"):
        compose(
            ["algo=dpo", "data=arith_pref", "algo.dpo.loss=ipo", "algo.dpo.label_smoothing=0.1"]
        )
    with pytest.raises(ConfigError, match=r"data\.name=arith: algo=rm trains on preference"):
        compose(["algo=rm"])
    with pytest.raises(ConfigError, match=r"trainer\.name=megatron: algo=rm"):
        compose(["algo=rm", "data=arith_pref", "trainer=megatron"])
    compose(["algo=dpo", "data=arith_pref", "trainer=megatron"])  # dpo trains on megatron
    with pytest.raises(ConfigError, match=r"trainer\.megatron\.vpp=2: algo=dpo runs without"):
        compose(["algo=dpo", "data=arith_pref", "trainer=megatron", "trainer.world_size=2",
                 "trainer.megatron.pp=2", "trainer.megatron.vpp=2"])  # fmt: skip
    with pytest.raises(ConfigError, match=r"trainer\.micro_batch_size=7: algo=dpo needs an even"):
        compose(["algo=dpo", "data=arith_pref", "trainer.micro_batch_size=7"])
    cfg = compose(["algo=dpo", "data=arith_pref", "algo.dpo.loss=simpo"])
    assert not cfg.algo.needs_reference  # simpo: no reference group
    assert compose(["algo=dpo", "data=arith_pref"]).algo.needs_reference
