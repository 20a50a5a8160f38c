"""data=reasoning_gym: rows from reasoning-gym's generators, split by weight, held-out
rows that never repeat a training question, its own verifiers as the reward, and
config mistakes named before anything starts."""

from __future__ import annotations

import pytest

from rlpost import compose
from rlpost.config.schema import ConfigError
from rlpost.data.reasoning_gym import reward, split_counts
from rlpost.data.rows import DataError
from rlpost.plan.inputs import load_data

pytest.importorskip("reasoning_gym")


def rg(*overrides: str):
    return compose(["algo=grpo", "data=reasoning_gym", *overrides])


def test_split_counts_follow_the_weights_and_sum_to_the_total():
    # 10 x 3/4 = 7.5 and 10 x 1/4 = 2.5: equal remainders, the first name gets the row
    assert split_counts(10, ["a", "b"], {"a": 3.0}) == {"a": 8, "b": 2}
    assert split_counts(7, ["a", "b", "c"], {}) == {"a": 3, "b": 2, "c": 2}  # 2.33 each
    assert sum(split_counts(1001, ["a", "b", "c"], {"b": 0.5}).values()) == 1001


def test_rows_are_generated_split_and_scored_by_the_dataset():
    cfg = rg(
        "data.reasoning_gym.datasets=[chain_sum,spell_backward]", "data.reasoning_gym.size=30",
        "data.val_size=10", "data.reasoning_gym.weights={chain_sum: 2}",
        "data.reasoning_gym.config={chain_sum: {min_terms: 2, max_terms: 2}}",
    )  # fmt: skip
    assert cfg.reward.fn == "reasoning_gym"  # data=reasoning_gym selects its verifiers
    train, val, dropped = load_data(cfg)
    assert dropped == 0
    assert [r["rg_dataset"] for r in train].count("chain_sum") == 20  # 30 x 2/3
    assert [r["rg_dataset"] for r in val].count("chain_sum") == 7  # 10 x 2/3 = 6.67
    questions = {r["rg_entry"]["question"] for r in train}
    assert not questions & {r["rg_entry"]["question"] for r in val}
    row = next(r for r in train if r["rg_dataset"] == "chain_sum")
    assert row["rg_entry"]["metadata"]["num_terms"] == 2  # the generator's config applied
    assert row["prompt"] == [{"role": "user", "content": row["rg_entry"]["question"]}]
    right, wrong = row["answer"], str(int(row["answer"]) + 1)
    assert reward(right, row) == {"correctness": 1.0}
    assert reward(f"think first <answer>{right}</answer>", row) == {"correctness": 1.0}
    assert reward(wrong, row) == {"correctness": 0.0}
    assert reward(f"<answer>{wrong}</answer> {right}", row) == {"correctness": 0.0}  # the tag wins
    # the same config draws the same rows; another seed others
    again, _, _ = load_data(cfg)
    assert [r["prompt"] for r in again] == [r["prompt"] for r in train]
    other, _, _ = load_data(compose([*_args(cfg), "trainer.seed=5"]))
    assert [r["prompt"] for r in other] != [r["prompt"] for r in train]


def _args(cfg) -> list[str]:
    d = cfg.data.reasoning_gym
    return [
        "algo=grpo", "data=reasoning_gym", f"data.reasoning_gym.datasets=[{','.join(d.datasets)}]",
        f"data.reasoning_gym.size={d.size}", f"data.val_size={cfg.data.val_size}",
    ]  # fmt: skip


def test_a_system_prompt_opens_each_prompt():
    cfg = rg("data.reasoning_gym.datasets=[chain_sum]", "data.reasoning_gym.size=2",
             "data.val_size=1", "data.reasoning_gym.system_prompt=default")  # fmt: skip
    train, _, _ = load_data(cfg)
    assert train[0]["prompt"][0]["role"] == "system"
    assert "<answer>" in train[0]["prompt"][0]["content"]


def test_config_mistakes_are_named_all_at_once():
    cfg = rg(
        "data.reasoning_gym.datasets=[chain_sums]", "data.reasoning_gym.weights={countdown: 1}",
        "data.reasoning_gym.system_prompt=verbose",
    )  # fmt: skip
    with pytest.raises(DataError) as info:
        load_data(cfg)
    text = str(info.value)
    assert "'chain_sums' is not a reasoning-gym dataset; did you mean chain_sum" in text
    assert "data.reasoning_gym.weights names ['countdown']" in text
    assert "system_prompt='verbose'" in text
    with pytest.raises(DataError, match="datasets is empty"):
        load_data(rg())
    with pytest.raises(DataError, match=r"fix data.reasoning_gym.config.chain_sum"):
        load_data(rg("data.reasoning_gym.datasets=[chain_sum]",
                     "data.reasoning_gym.config={chain_sum: {min_terms: 9, max_terms: 2}}"))  # fmt: skip
    with pytest.raises(ConfigError, match="data.reasoning_gym.size"):
        rg("data.reasoning_gym.datasets=[chain_sum]", "data.reasoning_gym.size=0")
