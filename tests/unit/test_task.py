"""Character tokenizer, tiny model presets and the built-in arithmetic task."""

from __future__ import annotations

import pytest

from rlpost.data.tasks import TASKS, build_task
from rlpost.data.tasks.arith import ArithTask, correctness, format_reward, reward
from rlpost.models.tiny import TINY_PRESETS, build_config, build_tokenizer, num_parameters


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_tokenizer_vocab_layout(tok):
    # 5 specials + 95 printable ASCII + newline = 101 -> 3 reserved -> 104.
    assert len(tok) == 104
    assert (tok.pad_token, tok.pad_token_id) == ("<|pad|>", 0)
    assert (tok.eos_token, tok.eos_token_id) == ("<|end|>", 4)
    assert tok.bos_token is None
    # Space is the first character token (id 5), so "0" (ASCII 48) is 5 + 16 = 21.
    assert tok.encode(" 0~\n", add_special_tokens=False) == [5, 21, 99, 100]


@pytest.mark.parametrize(
    "text", ["37+48=", "  two  spaces ", "line\nbreak\n\n", "~!@#$%^&*()_{}|:\"<>?`'", ""]
)
def test_tokenizer_round_trip_one_token_per_char(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)
    assert tok.decode(ids) == text


def test_tokenizer_special_tokens_are_single_ids(tok):
    ids = tok.encode("<|user|>1+2=<|end|><|assistant|>3", add_special_tokens=False)
    # <|user|>=1, "1"=22, "+"=16, "2"=23, "="=34, <|end|>=4, <|assistant|>=2, "3"=24
    assert ids == [1, 22, 16, 23, 34, 4, 2, 24]
    assert tok.decode(ids) == "<|user|>1+2=<|end|><|assistant|>3"
    assert tok.decode(ids, skip_special_tokens=True) == "1+2=3"
    assert tok.decode([3, 101]) == "<|system|><|reserved_0|>"


def test_tokenizer_drops_characters_outside_vocab(tok):
    assert tok.decode(tok.encode("a\té", add_special_tokens=False)) == "a"


def test_chat_template_renders_exactly(tok):
    messages = [
        {"role": "system", "content": "add"},
        {"role": "user", "content": "1+2="},
        {"role": "assistant", "content": "3"},
        {"role": "user", "content": "4+5="},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert (
        text
        == "<|system|>add<|end|><|user|>1+2=<|end|><|assistant|>3<|end|><|user|>4+5=<|end|><|assistant|>"
    )
    no_prompt = tok.apply_chat_template(messages[:1], tokenize=False)
    assert no_prompt == "<|system|>add<|end|>"


def test_presets_sizes():
    tok = build_tokenizer()
    for name in TINY_PRESETS:
        cfg = build_config(name, tok)
        assert cfg.vocab_size == 104 and cfg.tie_word_embeddings
        assert cfg.hidden_size // cfg.num_attention_heads in (32, 64)  # vLLM CPU head sizes
    # micro: embed 104*64 = 6656; per layer q 64*64+64, k,v 64*32+32 each, o 64*64,
    # mlp 3*64*128, norms 2*64 -> 4160+2*2080+4096+24576+128 = 37120; final norm 64.
    assert num_parameters("micro") == 6656 + 2 * 37120 + 64 == 80960
    assert 0.9e6 < num_parameters("tiny") < 1.1e6
    # small: embed 104*512 = 53248; per layer q 512*512+512, k,v 512*128+128 each,
    # o 512*512, mlp 3*512*2048, norms 2*512 -> 262656+2*65664+262144+3145728+1024
    # = 3802880; 8 layers + final norm 512: 30.5 M
    assert num_parameters("small") == 53248 + 8 * 3802880 + 512 == 30476800
    with pytest.raises(ValueError, match="choose one of"):
        build_config("huge", tok)


def test_task_split_deterministic_disjoint_and_complete():
    task = ArithTask(seed=3, max_operand=9, num_val=20)
    train, val = task.train_rows(), task.val_rows()
    assert (len(train), len(val)) == (80, 20)  # 10 * 10 ordered pairs
    prompts = lambda rows: [r["prompt"][0]["content"] for r in rows]  # noqa: E731
    assert not set(prompts(train)) & set(prompts(val))
    assert set(prompts(train)) | set(prompts(val)) == {
        f"{a}+{b}=" for a in range(10) for b in range(10)
    }
    assert train == ArithTask(seed=3, max_operand=9, num_val=20).train_rows()
    assert prompts(ArithTask(seed=4, max_operand=9, num_val=20).val_rows()) != prompts(val)


def test_task_rows_answers_and_sft_target():
    task = ArithTask()
    rows = task.train_rows()
    assert len(rows) == 100 * 100 - 200
    for row in rows[:50]:
        a, b = row["prompt"][0]["content"].rstrip("=").split("+")
        assert row["answer"] == str(int(a) + int(b))
        assert row["prompt"][0]["role"] == "user" and row["data_source"] == "arith"
    sft = task.sft_rows()
    assert sft[0] == {**rows[0], "response": rows[0]["answer"]}
    # The SFT target itself earns full reward: SFT and RL agree on the format.
    assert all(correctness(r["response"], r) == 1.0 for r in sft[:50])


def test_task_registry_and_validation():
    assert TASKS["arith"] is ArithTask
    assert build_task("arith", seed=1, num_val=5).num_val == 5
    with pytest.raises(ValueError, match="choose one of"):
        build_task("nope")
    with pytest.raises(ValueError, match=r"num_val must be in \[0, 4\)"):
        ArithTask(max_operand=1, num_val=4)


ROW = {"prompt": "37+48=", "answer": "85"}


@pytest.mark.parametrize(
    ("completion", "correct", "fmt"),
    [
        ("85", 1.0, 1.0),
        (" 85\n", 1.0, 1.0),
        ("85<|end|>", 1.0, 1.0),
        ("85<|end|>junk", 1.0, 1.0),  # only the text before the end token counts
        ("85<|im_end|>", 1.0, 1.0),
        ("84", 0.0, 1.0),
        ("085", 0.0, 1.0),
        ("8 5", 0.0, 0.0),
        ("85.", 0.0, 0.0),
        ("-85", 0.0, 0.0),
        ("", 0.0, 0.0),
        ("<|end|>", 0.0, 0.0),
        ("8\u00b5", 0.0, 0.0),  # micro sign is not a digit
        ("\u0668\u0665", 0.0, 0.0),  # Arabic-Indic 8 5: digits, but not ASCII
    ],
)
def test_correctness_and_format_rewards(completion, correct, fmt):
    assert correctness(completion, ROW) == correct
    assert format_reward(completion, ROW) == fmt
    assert reward(completion, ROW) == {"correctness": correct, "format": fmt}
