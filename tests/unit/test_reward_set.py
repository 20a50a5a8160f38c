"""Several reward functions in one total: names, weights, isolation, errors."""

from __future__ import annotations

import pytest

from rlpost.config.compose import compose
from rlpost.config.schema import ConfigError
from rlpost.plan.plan import build_plan
from rlpost.rewards.combine import RewardSet, build_scorer, check_names, reward_name
from rlpost.rewards.loading import RewardError, load_reward_fn
from rlpost.rewards.scoring import RewardScorer

ROW = {"prompt": "37+48=", "answer": "85"}


def starts_with_digit(completion, row):
    return 1.0 if completion[:1].isdigit() else 0.0


def exploding(completion, row):
    if completion == "boom":
        raise RuntimeError("boom")
    return {"length_ok": float(len(completion) <= 2)}


def test_names_come_from_the_spec():
    assert reward_name("math") == "math"
    assert reward_name("path/to/fmt.py:fmt") == "fmt"
    assert reward_name("pkg.mod:acc") == "acc"
    assert check_names(["a.py:fmt", "math"]) == []
    [problem] = check_names(["a.py:fmt", "b.py:fmt"])
    assert "'a.py:fmt' and 'b.py:fmt' are both named 'fmt'" in problem


def test_a_number_counts_under_the_function_name_and_a_dict_under_its_keys():
    arith = load_reward_fn("arith")  # {"correctness", "format"}, default weights 1.0 / 0.0
    rewards = RewardSet.of_functions(
        ["t.py:starts_with_digit", "arith"], [starts_with_digit, arith], {"starts_with_digit": 0.5}
    )
    scores, metrics = rewards.score(["85", "x85", "84"], [ROW] * 3)
    assert scores["starts_with_digit"] == [1.0, 0.0, 1.0]
    assert scores["correctness"] == [1.0, 0.0, 0.0]
    assert scores["format"] == [1.0, 0.0, 1.0]
    # total = 0.5 * digit + 1.0 * correctness + 0.0 * format (arith's default weight)
    #   "85": 0.5 + 1 = 1.5; "x85": 0; "84": 0.5
    assert scores["total"] == [1.5, 0.0, 0.5]
    assert metrics["reward/mean"] == pytest.approx(2.0 / 3)
    assert metrics["reward/starts_with_digit/mean"] == pytest.approx(2 / 3)
    assert metrics["reward/correctness/mean"] == pytest.approx(1 / 3)
    assert metrics["reward/arith/errors"] == 0.0 and metrics["reward/errors"] == 0.0


def test_a_failing_function_is_isolated_and_counted_under_its_name():
    rewards = RewardSet.of_functions(
        ["t.py:starts_with_digit", "t.py:exploding"], [starts_with_digit, exploding], {}
    )
    scores, metrics = rewards.score(["85", "boom", "123"], [ROW] * 3)
    # "boom" fails exploding only: its length_ok is 0, its starts_with_digit stays 0 (a letter)
    assert scores["length_ok"] == [1.0, 0.0, 0.0]
    assert scores["starts_with_digit"] == [1.0, 0.0, 1.0]
    assert scores["total"] == [2.0, 0.0, 1.0]  # weights 1.0 each
    assert metrics["reward/exploding/errors"] == 1.0
    assert metrics["reward/starts_with_digit/errors"] == 0.0
    assert metrics["reward/errors"] == 1.0


def test_clashing_score_names_and_unknown_weights_are_errors():
    arith = load_reward_fn("arith")
    twice = RewardSet.of_functions(
        ["arith", "m:other"], [arith, lambda c, row: {"format": 1.0}], {}
    )
    with pytest.raises(RewardError, match="arith and other both return a score named 'format'"):
        twice.score(["85"], [ROW])
    typo = RewardSet.of_functions(
        ["t.py:starts_with_digit", "arith"], [starts_with_digit, arith], {"fmt": 1}
    )
    with pytest.raises(RewardError, match=r"reward.weights name \['fmt'\], which no reward"):
        typo.score(["85"], [ROW])


def test_one_function_keeps_its_own_scorer():
    cfg = compose(["reward.weights.format=0.5"])
    scorer = build_scorer(["arith"], [load_reward_fn("arith")], cfg.reward)
    assert isinstance(scorer, RewardScorer)
    scores, _ = scorer.score(["84"], [ROW])
    assert scores["total"] == [0.5]  # correctness 0 (default weight 1) + 0.5 * format 1


def test_the_plan_loads_every_function_and_names_each_bad_one(tmp_path):
    path = tmp_path / "fmt.py"
    path.write_text("def fmt(completion, row):\n    return float(completion.isdigit())\n")
    overrides = [f"reward.fn=[{path}:fmt,arith]", "reward.weights.fmt=0.25", "reward.num_workers=0"]
    plan = build_plan(compose([*overrides, "trainer.device=cpu"]))
    assert plan.reward_specs == [f"{path}:fmt", "arith"]
    assert plan.algo.advantage.reward_weights == (
        ("correctness", 1.0),
        ("format", 0.0),
        ("fmt", 0.25),
    )
    scores, _ = plan.scorer().score(["85"], [ROW])
    assert scores["total"] == [1.25]  # 0.25 * fmt + 1.0 * correctness
    with pytest.raises(ConfigError) as info:
        build_plan(compose([f"reward.fn=[{path}:fmt,maths,{path}:nope]", "trainer.device=cpu"]))
    text = str(info.value)
    assert "'maths' is not a built-in reward" in text and "has no attribute 'nope'" in text
