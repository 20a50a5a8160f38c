"""The built-in verifiers, each a named reward: hand-written completions that are
right, wrong, malformed and adversarial, scored as the module docstrings say.

The code verifier starts a real sandbox per test case (~0.1 s each); the tests
below start 11 in all.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import pytest

from rlpost.rewards.loading import load_reward_fn
from rlpost.rewards.scoring import RewardScorer
from rlpost.rewards.verifiers import (
    code_reward,
    gsm8k_flexible_reward,
    gsm8k_reward,
    math_reward,
    think_format_reward,
)

# ---------------------------------------------------------------- math


@pytest.mark.parametrize(
    ("completion", "answer", "score"),
    [
        (r"so \boxed{\frac{1}{2}}", "0.5", 1.0),  # 1/2 == 0.5
        (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", 1.0),  # sqrt(8) = sqrt(4*2) = 2 sqrt(2)
        ("The answer is 12.", "12", 1.0),  # no box: the last number
        ("I tried 3, then got 12", "12", 1.0),
        (r"\boxed{13}", "12", 0.0),
        (r"\boxed{3} then \fbox{4}", "4", 1.0),  # \fbox counts; the last box wins
        (r"\boxed{\frac{1}{2}", "0.5", 0.0),  # the last box never closes: no answer
        (r"\boxed{}", "0", 0.0),
        ("I do not know.", "12", 0.0),
        ("", "12", 0.0),
        (r"\boxed{\{1,2\}}", r"\{2,1\}", 1.0),  # escaped braces inside the box balance
        (r"\boxed{12}<|im_end|>\boxed{13}", "12", 1.0),  # text after a special token is cut
    ],
)
def test_math_scores_the_final_answer_by_equivalence(completion, answer, score):
    assert math_reward(completion, {"answer": answer}) == {"math": score}


def test_math_counts_the_last_of_many_boxed_answers():
    repeated = r"\boxed{3} " * 500  # 5,000 characters; only the last 4,000 are read
    assert math_reward(repeated, {"answer": "4"}) == {"math": 0.0}
    assert math_reward(repeated, {"answer": "3"}) == {"math": 1.0}
    assert math_reward(repeated + r"\boxed{4}", {"answer": "4"}) == {"math": 1.0}


def test_math_reads_only_the_tail_of_a_huge_completion():
    start = time.perf_counter()
    assert math_reward("x" * 1_000_000 + r" \boxed{5}", {"answer": "5"}) == {"math": 1.0}
    assert math_reward(r"\boxed{" * 200_000, {"answer": "5"}) == {"math": 0.0}
    assert math_reward("9" * 1_000_000, {"answer": "5"}) == {"math": 0.0}
    assert time.perf_counter() - start < 1.0


def test_math_reads_the_answer_columns_in_order():
    assert math_reward("12", {"ground_truth": "12"}) == {"math": 1.0}
    assert math_reward("12", {"reward_model": {"ground_truth": "12"}}) == {"math": 1.0}
    assert math_reward("12", {"answer": 12, "ground_truth": "13"}) == {"math": 1.0}
    with pytest.raises(ValueError, match="'answer', 'ground_truth' or reward_model") as info:
        math_reward("12", {"prompt": "q", "reward_model": {"style": "rule"}})
    assert "['prompt', 'reward_model']" in str(info.value)


def test_math_runs_off_the_main_thread_without_signal_timeouts():
    # SIGALRM cannot be set off the main thread; the reward must not rely on it there.
    out: list[dict[str, float]] = []
    worker = threading.Thread(
        target=lambda: out.append(math_reward(r"\boxed{0.5}", {"answer": r"\frac12"}))
    )
    worker.start()
    worker.join()
    assert out == [{"math": 1.0}]


def test_math_without_math_verify_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # import raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'rlpost\[math\]'"):
        math_reward(r"\boxed{1}", {"answer": "1"})


# ---------------------------------------------------------------- gsm8k


@pytest.mark.parametrize(
    ("completion", "answer", "strict", "flexible"),
    [
        ("48 + 24 = 72\n#### 72", "72", 1.0, 1.0),
        ("#### 72.00", "72", 1.0, 1.0),  # 72.00 == 72 by value
        ("#### $1,000", "1000", 1.0, 1.0),  # "$" and "," dropped
        ("#### 72", "She sold 48 + 24 = 72 clips.\n#### 72", 1.0, 1.0),  # a full solution
        ("#### 5 #### 6", "6", 1.0, 1.0),  # the last #### counts
        ("#### 5 #### 6", "5", 0.0, 0.0),
        ("The answer is 72.", "72", 0.0, 1.0),  # no ####: only flexible finds it
        ("#### 72 is wrong, it is 73", "73", 0.0, 1.0),
        ("#### 71", "72", 0.0, 0.0),
        ("####72", "72", 0.0, 1.0),  # strict needs "#### " with the space, as verl
        ("no number here", "72", 0.0, 0.0),
        ("#### -3", "-3", 1.0, 1.0),
    ],
)
def test_gsm8k_strict_and_flexible(completion, answer, strict, flexible):
    row = {"answer": answer}
    assert gsm8k_reward(completion, row) == {"gsm8k": strict}
    assert gsm8k_flexible_reward(completion, row) == {"gsm8k_flexible": flexible}


def test_gsm8k_reads_only_the_last_300_characters():
    # As verl: an answer far before the end is not read, and a huge completion is cheap.
    assert gsm8k_reward("#### 72" + " " * 300, {"answer": "72"}) == {"gsm8k": 0.0}
    start = time.perf_counter()
    assert gsm8k_reward("#### 1 " * 150_000 + "#### 72", {"answer": "72"}) == {"gsm8k": 1.0}
    assert time.perf_counter() - start < 0.5


def test_gsm8k_rejects_a_row_without_a_numeric_answer():
    with pytest.raises(ValueError, match="does not end in a number"):
        gsm8k_reward("#### 1", {"answer": "seventy-two"})
    with pytest.raises(ValueError, match="has no answer"):
        gsm8k_reward("#### 1", {"prompt": "q"})


# ---------------------------------------------------------------- think_format

OPENED = {
    "prompt": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>\n"}]
}


@pytest.mark.parametrize(
    ("completion", "row", "score"),
    [
        ("<think>2+2 is 4</think>\n4", {}, 1.0),
        ("  \n<think>ok</think>4<|im_end|>", {}, 1.0),  # leading whitespace allowed
        ("<think></think>4", {}, 0.0),  # empty reasoning
        ("<think>ok</think>  ", {}, 0.0),  # no answer
        ("<think>ok</think><|im_end|>", {}, 0.0),  # only an end token after the block
        ("4 <think>ok</think>4", {}, 0.0),  # the block is not at the start
        ("<think>a</think><think>b</think>4", {}, 0.0),  # two blocks
        ("<think>ok</think>4</think>", {}, 0.0),  # a stray closing tag
        ("<think>ok 4", {}, 0.0),  # never closed
        ("4", {}, 0.0),
        ("2+2 is 4</think>4", OPENED, 1.0),  # the template opened the block
        ("2+2 is 4</think>4", {"prompt": "2+2? <think>"}, 1.0),
        ("2+2 is 4</think>4", {"prompt": "2+2?"}, 0.0),  # not opened by the prompt
        ("a</think>b</think>4", OPENED, 0.0),
        ("</think>4", OPENED, 0.0),  # empty reasoning
    ],
)
def test_think_format(completion, row, score):
    assert think_format_reward(completion, row) == {"think_format": score}


# ---------------------------------------------------------------- code

ADD = {
    "tests": [
        {"input": "1 2\n", "output": "3\n"},
        {"input": "2 2\n", "output": "4"},
        {"input": "5 5\n", "output": "10"},
    ]
}
WRONG_ON_FIVES = "```python\na, b = map(int, input().split())\nprint(a + b if a != 5 else 0)\n```"


def test_code_scores_the_fraction_of_stdin_cases_passed():
    # right on "1 2" and "2 2", wrong on "5 5": 2 / 3 = 0.667
    completion = "First a draft:\n```python\nprint(0)\n```\nFixed:\n" + WRONG_ON_FIVES
    assert code_reward(completion, ADD) == {"code": pytest.approx(2 / 3)}


def test_code_a_loop_or_an_early_exit_fails_its_case():
    one = {"tests": [{"input": "1 2", "output": "3"}]}
    assert code_reward("```\nwhile True:\n    pass\n```", one, timeout_s=0.5) == {"code": 0.0}
    # the right output, then a nonzero exit: a crash fails the case
    assert code_reward("print(3)\nimport os; os._exit(3)", one) == {"code": 0.0}


def test_code_runs_asserts_after_the_program():
    mbpp = {"test_list": ["assert add1(1) == 2", "assert add1(2) == 4"]}
    program = (
        "```py\nfrom __future__ import annotations\ndef add1(x: int) -> int:\n    return x + 1\n```"
    )
    assert code_reward(program, mbpp) == {"code": 0.5}  # 1 + 1 == 2 passes, 2 + 1 == 4 does not
    # exiting with status 0 before the assert runs does not pass it
    one = {"tests": ["assert add1(1) == 2"]}
    assert code_reward("import os\nos._exit(0)", one) == {"code": 0.0}
    # sys.exit() in the program still lets the assert run
    assert code_reward("import sys\nadd1 = lambda x: x + 1\nsys.exit(0)", one) == {"code": 1.0}


def test_code_reads_apps_input_output_as_json():
    row = {"input_output": json.dumps({"inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10\n"]})}
    assert load_reward_fn("code")(WRONG_ON_FIVES, row) == {"code": 0.5}


def test_code_without_a_program_scores_zero_without_running():
    # None of these starts a sandbox: no python block, or source that does not compile.
    assert code_reward("I cannot solve this.", ADD) == {"code": 0.0}
    assert code_reward("```bash\necho 3\n```", ADD) == {"code": 0.0}
    assert code_reward("```python\nprint(3\n```", ADD) == {"code": 0.0}
    assert code_reward("```python\nprint(3)\n", ADD) == {"code": 0.0}  # the fence never closes
    assert code_reward("print(3)", ADD, total_timeout_s=0.0) == {"code": 0.0}  # no time left


def test_code_rows_without_test_cases_say_which_columns_it_reads():
    with pytest.raises(ValueError, match="no test cases: add 'tests'.*'input_output'.*'test_list'"):
        code_reward("print(1)", {"answer": "1"})
    with pytest.raises(ValueError, match="call-based"):
        code_reward("print(1)", {"input_output": {"fn_name": "f", "inputs": [[1]], "outputs": [2]}})
    with pytest.raises(ValueError, match="empty list"):
        code_reward("print(1)", {"tests": []})


# ---------------------------------------------------------------- by name


def test_the_verifiers_resolve_by_name():
    for name, fn in [
        ("math", math_reward),
        ("gsm8k", gsm8k_reward),
        ("gsm8k_flexible", gsm8k_flexible_reward),
        ("think_format", think_format_reward),
        ("code", code_reward),
    ]:
        assert load_reward_fn(name) is fn


def test_scorer_reports_the_verifier_by_its_name():
    rows = [{"answer": "Half of 144 is 72.\n#### 72"}] * 3
    scores, metrics = RewardScorer(load_reward_fn("gsm8k")).score(["#### 72", "#### 7", "72"], rows)
    assert scores == {"total": [1.0, 0.0, 0.0], "gsm8k": [1.0, 0.0, 0.0]}
    assert metrics["reward/gsm8k/mean"] == pytest.approx(1 / 3)  # (1 + 0 + 0) / 3
