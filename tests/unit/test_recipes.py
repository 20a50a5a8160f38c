"""The GSM8K and MATH recipes' CPU side: preparation from the hub's layouts on a
20-row sample written here, then the recipe's rewards on the prepared rows."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlpost.data.rows import load_rows
from rlpost.rewards.combine import RewardSet
from rlpost.rewards.loading import load_reward_fn

RECIPES = Path(__file__).resolve().parents[2] / "examples" / "recipes"


def recipe(name: str):
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", RECIPES / name / "prepare.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gsm8k_rows(n: int) -> list[dict]:
    return [
        {"question": f"Ann has {i} pens and buys {i + 3}. How many now?",
         "answer": f"She has {i} + {i + 3} = {2 * i + 3} pens.\n#### {2 * i + 3:,}"}
        for i in range(n)
    ]  # fmt: skip


def test_gsm8k_preparation_from_parquet_and_a_saved_folder(tmp_path):
    gsm8k = recipe("gsm8k")
    (tmp_path / "hub" / "main").mkdir(parents=True)
    rows = gsm8k_rows(20)
    pq.write_table(
        pa.Table.from_pylist(rows[:15]), tmp_path / "hub/main/train-00000-of-00001.parquet"
    )
    pq.write_table(
        pa.Table.from_pylist(rows[15:]), tmp_path / "hub/main/test-00000-of-00001.parquet"
    )
    assert gsm8k.main([str(tmp_path / "hub"), str(tmp_path / "out")]) == 0
    train = load_rows(tmp_path / "out" / "train.parquet")
    test = load_rows(tmp_path / "out" / "test.parquet")
    assert (len(train), len(test)) == (15, 5)
    assert train[2]["answer"] == "7" and train[2]["prompt"][1]["content"] == rows[2]["question"]
    assert test[4]["answer"] == "41"  # 19 + 22; "#### 41" (commas dropped: 1,234 -> 1234)
    assert train[0]["data_source"] == "openai/gsm8k"
    # the recipe's rewards: strict gsm8k 1.0 + flexible 0.1
    rewards = RewardSet.of_functions(
        ["gsm8k", "gsm8k_flexible"],
        [load_reward_fn("gsm8k"), load_reward_fn("gsm8k_flexible")],
        {"gsm8k": 1.0, "gsm8k_flexible": 0.1},
    )
    scores, _ = rewards.score(["2 + 5 = 7\n#### 7", "It is 7.", "#### 8"], [train[2]] * 3)
    assert scores["total"] == pytest.approx([1.1, 0.1, 0.0])
    datasets = pytest.importorskip("datasets")
    saved = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(rows[:15]),
            "test": datasets.Dataset.from_list(rows[15:]),
        }
    )
    saved.save_to_disk(str(tmp_path / "saved"))
    assert gsm8k.prepare(tmp_path / "saved", tmp_path / "out2") == {"train": 15, "test": 5}
    assert gsm8k.main([str(tmp_path / "empty"), str(tmp_path / "out3")]) == 2


def test_math_preparation_takes_the_boxed_answer(tmp_path):
    math = recipe("math")
    rows = [
        {"problem": f"What is {i}/2?", "solution": f"Halve it: $\\boxed{{\\frac{{{i}}}{{2}}}}$.",
         "level": "Level 1", "type": "Algebra"}
        for i in range(19)
    ] + [{"problem": "No answer here", "solution": "none", "level": "Level 5", "type": "Algebra"}]  # fmt: skip
    (tmp_path / "hub" / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "hub/data/test-00000-of-00001.parquet")
    assert math.prepare(tmp_path / "hub", tmp_path / "out", ["test"]) == {"test": (19, 1)}
    test = load_rows(tmp_path / "out" / "test.parquet")
    assert test[3]["answer"] == "\\frac{3}{2}" and test[3]["subject"] == "Algebra"
    assert test[3]["prompt"][0]["content"].endswith("put the final answer in \\boxed{}.")
    pytest.importorskip("math_verify")
    reward = load_reward_fn("math")
    assert reward("so it is \\boxed{1.5}", test[3]) == {"math": 1.0}
    assert reward("so it is \\boxed{2}", test[3]) == {"math": 0.0}
