"""Row loading and validation, the prompt stream, reward loading and scoring."""

from __future__ import annotations

import json
import logging

import pytest

from rlpost.data.rows import DataError, PromptStream, load_rows, prompt_messages, validate_row
from rlpost.data.tasks import arith
from rlpost.rewards.loading import RewardError, load_reward_fn
from rlpost.rewards.scoring import RewardScorer

GOOD = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(5)]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_load_rows_jsonl_json_and_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    assert load_rows(_write_jsonl(tmp_path / "a.jsonl", GOOD)) == GOOD
    (tmp_path / "b.json").write_text(json.dumps(GOOD))  # one top-level array
    assert load_rows(tmp_path / "b.json") == GOOD
    (tmp_path / "c.json").write_text(json.dumps(GOOD[0]) + "\n\n" + json.dumps(GOOD[1]))
    assert load_rows(str(tmp_path / "c.json")) == GOOD[:2]  # JSON lines, blank line skipped
    chat = [{"prompt": [{"role": "user", "content": "hi"}], "answer": "x"}]
    pq.write_table(pa.Table.from_pylist(chat), tmp_path / "d.parquet")
    assert load_rows(tmp_path / "d.parquet") == chat


def test_load_rows_errors_name_the_problem(tmp_path):
    with pytest.raises(DataError, match=r"missing\.jsonl: no such file"):
        load_rows(tmp_path / "missing.jsonl")
    (tmp_path / "x.csv").write_text("prompt\nhi\n")
    with pytest.raises(
        DataError, match=r"unsupported file type '\.csv'; accepted: \.jsonl, \.json, \.parquet"
    ):
        load_rows(tmp_path / "x.csv")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\n{"prompt": \n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2: invalid JSON line"):
        load_rows(tmp_path / "bad.jsonl")


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"prompt": "hi"}, None),
        ({"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}, None),
        ({"prompt": [{"role": "user", "content": [{"type": "text", "text": "u"}]}]}, None),
        (["prompt"], "row has type list, expected an object with a 'prompt' field"),
        (
            {"question": "hi"},
            "row has no 'prompt' field (fields: ['question']); name the column that holds it "
            "with data.prompt_key=<column>, or build it from the row's fields with "
            "data.prompt_template (an agent.program takes rows without one: it gets the whole row)",
        ),
        ({"prompt": ""}, "'prompt' is an empty string"),
        ({"prompt": 3}, "'prompt' has type int, expected a string or a list of messages"),
        ({"prompt": []}, "'prompt' is an empty list of messages"),
        ({"prompt": ["hi"]}, "'prompt'[0] has type str, expected {'role', 'content'}"),
        ({"prompt": [{"role": "user"}]}, "'prompt'[0] lacks ['content']"),
        (
            {"prompt": [{"role": 1, "content": "c"}]},
            "'prompt'[0]['role'] has type int, expected str",
        ),
        (
            {"prompt": [{"role": "user", "content": None}]},
            "'prompt'[0]['content'] has type NoneType, expected a string or a list of content parts",
        ),
    ],
)
def test_validate_row(row, reason):
    assert validate_row(row) == reason


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"question": "hi", "mode": "tool"}, None),
        ({"prompt": ""}, "'prompt' is an empty string"),
        (
            {"question": "hi", "max_tokens": -1},
            "'max_tokens' is -1, expected a whole number >= 0 (or leave it out)",
        ),
    ],
)
def test_a_row_for_an_agent_program_needs_no_prompt(row, reason):
    assert validate_row(row, needs_prompt=False) == reason
    stream = PromptStream([row, {"prompt": "a"}], seed=0, batch_size=1, needs_prompt=False)
    assert stream.num_malformed == (reason is not None)


def test_prompt_messages():
    assert prompt_messages({"prompt": "2+2="}) == [{"role": "user", "content": "2+2="}]
    msgs = [{"role": "user", "content": "x"}]
    assert prompt_messages({"prompt": msgs}) is msgs


def test_stream_counts_malformed_and_warns(caplog):
    rows = [GOOD[0], {"question": "?"}, GOOD[1], {"prompt": 7}]
    with caplog.at_level(logging.WARNING, logger="rlpost.data.rows"):
        stream = PromptStream(rows, seed=0, batch_size=2, source="train.jsonl")
    assert stream.num_malformed == 2 and stream.rows == [GOOD[0], GOOD[1]]
    assert "train.jsonl: skipped 2 malformed of 4 rows; first: train.jsonl row 1:" in caplog.text
    with pytest.raises(
        DataError,
        match=r"t\.jsonl: no usable rows out of 2; first problem: t\.jsonl row 0: row has no 'prompt'",
    ):
        PromptStream([{"q": 1}, {"prompt": ""}], seed=0, batch_size=1, source="t.jsonl")


def test_stream_epochs_are_permutations_and_deterministic():
    stream = PromptStream(GOOD, seed=7, batch_size=2)
    # 5 rows, batches of 2: batch 3 takes the last row of epoch 0 and the first of epoch 1.
    batches = [stream.next_batch() for _ in range(5)]  # 10 rows = 2 epochs
    flat = [r["prompt"] for b in batches for r in b]
    assert sorted(flat[:5]) == sorted(r["prompt"] for r in GOOD)
    assert sorted(flat[5:]) == sorted(r["prompt"] for r in GOOD)
    assert flat[:5] != flat[5:]  # reshuffled (seed 7 gives different orders)
    assert stream.state_dict() == {"epoch": 1, "position": 5, "num_rows": 5}
    again = PromptStream(GOOD, seed=7, batch_size=2)
    assert [r["prompt"] for _ in range(5) for r in again.next_batch()] == flat
    other = PromptStream(GOOD, seed=8, batch_size=2)
    assert [r["prompt"] for _ in range(5) for r in other.next_batch()] != flat


def test_stream_resume_is_exact():
    stream = PromptStream(GOOD, seed=1, batch_size=3)
    stream.next_batch(), stream.next_batch()
    state = stream.state_dict()
    assert state == {"epoch": 1, "position": 1, "num_rows": 5}  # 6 rows taken: 5 + 1
    expected = [stream.next_batch() for _ in range(3)]
    resumed = PromptStream(GOOD, seed=1, batch_size=3)
    resumed.load_state_dict(state)
    assert [resumed.next_batch() for _ in range(3)] == expected
    with pytest.raises(DataError, match="checkpoint saw 5 valid rows, the data now has 4"):
        PromptStream(GOOD[:4], seed=1, batch_size=3).load_state_dict(state)


USER_REWARD = """
def exact(completion, row):
    return float(completion == row["answer"])

def parts(completion, row):
    return {"len": float(len(completion)), "hit": float(completion == row["answer"])}

NOT_FN = 3
"""


def test_load_reward_fn_from_file_module_and_builtin(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(USER_REWARD)
    fn = load_reward_fn(f"{path}:exact")
    assert fn("3", {"answer": "3"}) == 1.0 and fn("4", {"answer": "3"}) == 0.0
    assert load_reward_fn("rlpost.data.tasks.arith:correctness") is arith.correctness
    assert load_reward_fn("arith") is arith.reward


def test_load_reward_fn_errors_say_what_to_change(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(USER_REWARD)
    cases = {
        f"{tmp_path}/nope.py:f": "nope.py' does not exist; fix the path",
        f"{path}:missing": "has no attribute 'missing'; its functions: ['exact', 'parts']",
        f"{path}:NOT_FN": "'NOT_FN' has type int, not callable",
        "no_such_pkg_xyz.mod:f": "cannot import module 'no_such_pkg_xyz.mod'",
        "arithmetic": "'arithmetic' is not a built-in reward; use a built-in name (arith, calc, code, gsm8k, gsm8k_flexible, math, reasoning_gym, shapes, think_format)",
        ":f": "is malformed",
    }
    for spec, message in cases.items():
        with pytest.raises(RewardError) as info:
            load_reward_fn(spec)
        assert message in str(info.value) and repr(spec) in str(info.value)
    (tmp_path / "broken.py").write_text("import not_a_module_xyz\n")
    with pytest.raises(RewardError, match="importing .*broken.py' raised ModuleNotFoundError"):
        load_reward_fn(f"{tmp_path}/broken.py:f")


def test_scorer_isolates_a_raising_call(caplog):
    def fn(completion, row):
        if completion == "boom":
            raise KeyError("answer")
        return 0.5 if completion == "half" else 1.0

    scorer = RewardScorer(fn)
    with caplog.at_level(logging.WARNING, logger="rlpost.rewards.scoring"):
        scores, metrics = scorer.score(["ok", "boom", "half", "boom"], [{}] * 4)
        scorer.score(["boom"], [{}])
    assert scores == {"total": [1.0, 0.0, 0.5, 0.0]}
    # mean = (1 + 0 + 0.5 + 0) / 4 = 0.375
    assert metrics == {"reward/mean": 0.375, "reward/errors": 2.0, "reward/timeouts": 0.0}
    assert caplog.text.count("KeyError: 'answer'") == 1  # once per distinct message


def test_scorer_counts_non_numbers_as_errors():
    results = iter([1.0, "1", None, float("nan"), True])
    scores, metrics = RewardScorer(lambda c, r: next(results)).score(["a"] * 5, [{}] * 5)
    # str, None and NaN are errors; bool is rejected too (a likely bug, not a score).
    assert scores["total"] == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert metrics["reward/errors"] == 4.0


def test_scorer_named_rewards_and_weights():
    values = iter([{"a": 1.0, "b": 2.0}, {"a": 0.0, "b": 4.0}, {"a": 1.0}, 3.0])
    scores, metrics = RewardScorer(lambda c, r: next(values), {"b": 0.5}).score(["x"] * 4, [{}] * 4)
    # totals: 1 + 0.5*2 = 2; 0 + 0.5*4 = 2; missing "b" -> error; number among dicts -> error
    assert scores == {
        "total": [2.0, 2.0, 0.0, 0.0],
        "a": [1.0, 0.0, 0.0, 0.0],
        "b": [2.0, 4.0, 0.0, 0.0],
    }
    assert metrics == {
        "reward/mean": 1.0,
        "reward/errors": 2.0,
        "reward/timeouts": 0.0,
        "reward/a/mean": 0.25,
        "reward/b/mean": 1.5,
    }
    with pytest.raises(RewardError, match=r"weights name \['c'\] but .* returns \['a'\]"):
        RewardScorer(lambda c, r: {"a": 1.0}, {"c": 1.0}).score(["x"], [{}])


def test_scorer_builtin_arith_total_is_correctness():
    row = {"prompt": "37+48=", "answer": "85"}
    scorer = RewardScorer(load_reward_fn("arith"))
    scores, metrics = scorer.score(["85", "84", "x", "85<|end|>"], [row] * 4)
    assert scores == {
        "total": [1.0, 0.0, 0.0, 1.0],
        "correctness": [1.0, 0.0, 0.0, 1.0],
        "format": [1.0, 1.0, 0.0, 1.0],
    }
    assert metrics["reward/mean"] == 0.5 and metrics["reward/format/mean"] == 0.75
    weighted, _ = RewardScorer(arith.reward, {"correctness": 1.0, "format": 0.5}).score(
        ["84"], [row]
    )
    assert weighted["total"] == [0.5]  # 1.0 * 0 + 0.5 * 1
