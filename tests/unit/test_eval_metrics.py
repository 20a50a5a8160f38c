"""The evaluation metrics against hand-computed values: Chen et al.'s unbiased
pass@k, mean@n, greedy accuracy and maj@k, per prompt then averaged over prompts,
overall and per data source."""

from __future__ import annotations

from math import comb
from types import SimpleNamespace

import pytest

from rlpost.evaluation.metrics import (
    PromptSamples,
    answer_of,
    answer_source,
    maj_at_k,
    pass_at_k,
    prompt_samples,
    summarize,
    val_ks,
    validation_metrics,
)


def test_pass_at_k_hand_computed():
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # n=4, c=1, k=1: 1 - C(3,1)/C(4,1) = 1 - 3/4 = 0.25 = c/n
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    # n=10, c=3, k=5: 1 - C(7,5)/C(10,5) = 1 - 21/252 = 0.91667
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)
    # no correct sample: 1 - C(n,k)/C(n,k) = 0
    assert pass_at_k(8, 0, 3) == 0.0


def test_pass_at_k_when_every_draw_holds_a_correct_sample():
    # n - c < k: n=5, c=4, k=2 -> one wrong sample cannot fill a draw of 2: 1.0
    assert pass_at_k(5, 4, 2) == 1.0
    # n - c = k exactly: n=5, c=3, k=2 -> 1 - C(2,2)/C(5,2) = 1 - 1/10 = 0.9
    assert pass_at_k(5, 3, 2) == pytest.approx(0.9)
    # all correct: 1.0 for every k
    assert [pass_at_k(3, 3, k) for k in (1, 2, 3)] == [1.0, 1.0, 1.0]
    # k = n with one correct sample: the one draw is all samples -> 1.0
    assert pass_at_k(4, 1, 4) == 1.0


def test_pass_at_k_is_c_over_n_at_k_1_and_matches_the_binomials():
    # pass@1 = 1 - (n-c)/n = c/n for the unbiased estimator
    for n in (1, 4, 16):
        for c in range(n + 1):
            assert pass_at_k(n, c, 1) == pytest.approx(c / n)
    # the stable product against the ratio of binomials of eq. 1
    for n, c, k in [(16, 5, 4), (20, 1, 10), (7, 2, 5)]:
        assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))


def test_pass_at_k_refuses_impossible_arguments():
    with pytest.raises(ValueError, match="k=5"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="k=0"):
        pass_at_k(4, 1, 0)
    with pytest.raises(ValueError, match="c=5"):
        pass_at_k(4, 5, 1)


def test_answer_of_prefers_the_rewards_own_extractor_then_boxed_then_numbers():
    def reward(completion, row):
        return 0.0

    reward.extract_answer = lambda text: text.split("answer:")[-1].strip()  # type: ignore[attr-defined]
    assert answer_of("so answer: blue", reward) == "blue"
    assert answer_of("a \\boxed{1} then \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    assert answer_of("12 + 30 = 42<|end|>") == "42"
    assert answer_of("  yes \n") == "yes"
    # the built-in arith reward has no extractor: its digits are the last number
    from rlpost.data.tasks import arith

    assert answer_of("85<|end|>", arith.reward) == "85"


def test_maj_at_k_with_a_tie_goes_to_the_answer_seen_first():
    answers = ["7", "9", "9", "7", "3"]
    correct = [False, True, True, False, False]
    # k=1: "7" alone -> wrong: 0
    assert maj_at_k(answers, correct, 1) == 0.0
    # k=2: "7" and "9" once each, a tie -> "7" came first -> wrong: 0
    assert maj_at_k(answers, correct, 2) == 0.0
    # k=3: "9" twice beats "7" once -> correct: 1
    assert maj_at_k(answers, correct, 3) == 1.0
    # k=4: "7" 2, "9" 2, tie -> "7" first -> 0
    assert maj_at_k(answers, correct, 4) == 0.0
    # samples without an answer do not vote; none at all scores 0
    assert maj_at_k([None, "9", None], [False, True, False], 3) == 1.0
    assert maj_at_k([None, None], [True, True], 2) == 0.0


def test_summarize_per_prompt_then_over_prompts_and_per_source():
    prompts = [
        # a: 2 of 4 correct; greedy right
        PromptSamples([1, 0, 1, 0], ["5", "6", "5", "6"], greedy=1.0, source="a"),
        # a: 0 of 4 correct; greedy wrong
        PromptSamples([0, 0, 0, 0], ["1", "2", "2", "3"], greedy=0.0, source="a"),
        # b: 4 of 4 correct
        PromptSamples([1, 1, 1, 1], ["8"] * 4, greedy=1.0, source="b"),
    ]
    out = summarize(prompts, ks=[1, 2, 4], threshold=1.0)
    o = out["overall"]
    # mean@n: (0.5 + 0 + 1) / 3 = 0.5
    assert o["mean@n"] == pytest.approx(0.5)
    assert o["pass@1"] == pytest.approx(0.5)
    # pass@2: prompt 1: 1 - C(2,2)/C(4,2) = 1 - 1/6 = 5/6; prompt 2: 0; prompt 3: 1
    #         -> (5/6 + 0 + 1) / 3 = 11/18
    assert o["pass@2"] == pytest.approx(11 / 18)
    # pass@4: 1, 0, 1 -> 2/3
    assert o["pass@4"] == pytest.approx(2 / 3)
    # maj@4: prompt 1 tie "5"/"6" -> "5" first -> correct 1; prompt 2 "2" wrong 0; prompt 3: 1
    assert o["maj@4"] == pytest.approx(2 / 3)
    # greedy: (1 + 0 + 1) / 3
    assert o["greedy"] == pytest.approx(2 / 3)
    assert o["prompts"] == 3
    a, b = out["per_source"]["a"], out["per_source"]["b"]
    # source a: mean@n (0.5 + 0) / 2 = 0.25; pass@2 (5/6 + 0) / 2 = 5/12
    assert a["mean@n"] == pytest.approx(0.25) and a["pass@2"] == pytest.approx(5 / 12)
    assert a["prompts"] == 2 and b["prompts"] == 1 and b["pass@1"] == 1.0


def test_the_threshold_decides_correct_and_mean_keeps_the_raw_scores():
    # scores 0.9, 0.4: threshold 1.0 -> none correct; threshold 0.5 -> one of two
    p = [PromptSamples([0.9, 0.4], ["x", "y"])]
    assert summarize(p, [1], 1.0)["overall"]["pass@1"] == 0.0
    assert summarize(p, [1], 0.5)["overall"]["pass@1"] == pytest.approx(0.5)
    # mean@n = (0.9 + 0.4) / 2 = 0.65 either way; no greedy, no sources
    out = summarize(p, [1], 0.5)
    assert out["overall"]["mean@n"] == pytest.approx(0.65)
    assert "greedy" not in out["overall"] and out["per_source"] == {}


def _result(*texts: str) -> SimpleNamespace:
    return SimpleNamespace(completions=[SimpleNamespace(text=t) for t in texts])


def test_validation_metrics_from_results_and_the_rewards_correctness():
    rows = [{"prompt": "1+1=", "data_source": "arith"}, {"prompt": "2+2=", "data_source": "arith"}]
    results = [_result("2", "3", "2", "2"), _result("5", "4", "5", "1")]
    # correctness is the judged score (not the total, which is 0.5 everywhere here)
    scores = {"total": [0.5] * 8, "correctness": [1, 0, 1, 1, 0, 1, 0, 0]}
    m = validation_metrics(rows, results, scores, n=4)
    # mean@n: (3/4 + 1/4) / 2 = 0.5; pass@2: prompt 1: 1 - C(1,2)/C(4,2) = 1 (n-c=1<2),
    # prompt 2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5 -> 0.75
    assert m["val/mean@n"] == pytest.approx(0.5) and m["val/pass@1"] == pytest.approx(0.5)
    assert m["val/pass@2"] == pytest.approx(0.75) and m["val/pass@4"] == 1.0
    # maj@4: prompt 1 "2" x3 correct -> 1; prompt 2 "5" x2 wrong -> 0 -> 0.5
    assert m["val/maj@4"] == pytest.approx(0.5)
    assert m["val/arith/mean@n"] == pytest.approx(0.5)
    assert set(m) == {
        "val/mean@n", "val/pass@1", "val/pass@2", "val/pass@4", "val/maj@4", "val/arith/mean@n"
    }  # fmt: skip


def test_prompt_samples_checks_the_score_count():
    with pytest.raises(ValueError, match="3 scores for 2 completions"):
        prompt_samples([{"prompt": "x"}], [_result("a", "b")], {"total": [1, 0, 1]})


def test_val_ks_are_one_the_powers_of_two_between_and_n():
    assert val_ks(1) == [1]
    assert val_ks(2) == [1, 2]
    assert val_ks(4) == [1, 2, 4]
    assert val_ks(6) == [1, 2, 4, 6]
    assert val_ks(16) == [1, 2, 4, 8, 16]


def test_answer_source_finds_the_extractor_of_one_or_several_rewards():
    def plain(completion, row):
        return 0.0

    def verifier(completion, row):
        return 0.0

    verifier.extract_answer = str.strip  # type: ignore[attr-defined]
    assert answer_source(plain) is None
    assert answer_source([plain, verifier]) is verifier
    assert answer_source(SimpleNamespace(fn=verifier)) is verifier  # a RewardScorer
    assert answer_source(SimpleNamespace(fns=[plain, verifier])) is verifier  # several
