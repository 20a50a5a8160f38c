"""Reward functions in both calling styles, in worker processes with timeouts, and
the stop when most calls of a step fail."""

from __future__ import annotations

import textwrap
import time

import pytest

from rlpost.rewards.loading import RewardError, load_reward_fn
from rlpost.rewards.scoring import RewardScorer, call_plan

ROW = {"prompt": "2+2=", "answer": "4", "level": 1}
COLUMNS = set(ROW)


def test_row_style_and_column_style_are_told_apart_by_signature():
    def by_row(completion, row):
        return float(completion == row["answer"])

    def by_columns(completion, answer=None, **row):  # the style TRL uses
        return float(completion == answer) + 0.5 * row["level"]

    def named_columns(completion, answer):  # 'answer' is a column: keyword style
        return float(completion == answer)

    def short_name(c, r):  # 'r' is no column: the whole row
        return float(c == r["answer"])

    def with_messages(completion, answer, messages=None):
        return float(len(messages or []))

    assert call_plan(by_row, COLUMNS).style == "row"
    assert call_plan(by_columns, COLUMNS).style == "columns"
    assert call_plan(named_columns, COLUMNS).style == "columns"
    assert call_plan(short_name, COLUMNS).style == "row"
    rows = [ROW, ROW]
    for fn, expected in (
        (by_row, [1.0, 0.0]),
        (by_columns, [1.5, 0.5]),  # 1 + 0.5 * level 1 ; 0 + 0.5
        (named_columns, [1.0, 0.0]),
        (short_name, [1.0, 0.0]),
    ):
        scores, metrics = RewardScorer(fn).score(["4", "5"], rows)
        assert scores["total"] == expected, fn.__name__
        assert metrics["reward/errors"] == 0
    extras = [{"messages": [{}, {}, {}]}, {"messages": [{}]}]
    scores, _ = RewardScorer(with_messages).score(["4", "5"], rows, extras)
    assert scores["total"] == [3.0, 1.0]


def test_signatures_rlpost_cannot_call_are_clear_errors():
    def needs_unknown(completion, answer, difficulty):
        return 0.0

    with pytest.raises(RewardError, match=r"\['difficulty'\] are not columns of the data"):
        call_plan(needs_unknown, COLUMNS)

    def row_then_required(completion, row, scale):
        return 0.0

    with pytest.raises(RewardError, match=r"\['scale'\] after `row`.*give them defaults"):
        call_plan(row_then_required, COLUMNS)


def test_step_with_mostly_failing_calls_stops_with_first_traceback():
    def score(completion, answer, **row):
        return float(completion == row["solution"])  # a typo: the column is 'answer'

    scorer = RewardScorer(score, max_error_frac=0.5)
    with pytest.raises(RewardError) as info:
        scorer.score(["4", "5", "6"], [ROW] * 3)
    message = str(info.value)
    assert "3 of 3 calls failed" in message and "reward.max_error_frac=0.5" in message
    assert "score(completion: str, **columns)" in message  # what rlpost passes
    assert "KeyError: 'solution'" in message and "Traceback" in message
    # At or below the limit the step goes on, the failures scored 0 and counted.
    flaky = RewardScorer(lambda c, row: 1.0 / int(c), max_error_frac=0.5)
    scores, metrics = flaky.score(["1", "0", "2", "0"], [ROW] * 4)
    assert scores["total"] == [1.0, 0.0, 0.5, 0.0] and metrics["reward/errors"] == 2


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "slow_reward.py"
    path.write_text(
        textwrap.dedent(
            """
            import os, time

            def score(completion, answer=None, **row):
                if completion == "hang":
                    while True:
                        time.sleep(0.1)
                if completion == "crash":
                    os._exit(3)
                if completion == "raise":
                    raise ValueError("bad sample")
                time.sleep(float(row.get("delay", 0)))
                return float(completion == answer)
            """
        )
    )
    return f"{path}:score"


def test_pool_scores_concurrently_and_survives_hangs_and_crashes(reward_file):
    fn = load_reward_fn(reward_file)
    scorer = RewardScorer(fn, spec=reward_file, num_workers=2, timeout_s=1.5)
    try:
        scorer.score(["4"], [ROW])  # start the workers
        slow = {**ROW, "delay": 0.5}
        start = time.perf_counter()
        scores, _ = scorer.score(["4", "4", "x", "4"], [slow] * 4)
        seconds = time.perf_counter() - start
        assert scores["total"] == [1.0, 1.0, 0.0, 1.0]
        assert seconds < 1.6, seconds  # 4 x 0.5 s on 2 workers: ~1 s, not 2 s serial

        start = time.perf_counter()
        scores, metrics = scorer.score(["hang", "4", "crash", "raise", "4"], [ROW] * 5)
        assert scores["total"] == [0.0, 1.0, 0.0, 0.0, 1.0]
        assert metrics["reward/errors"] == 3 and metrics["reward/timeouts"] == 1
        assert time.perf_counter() - start < 10
        assert scorer.pool.restarts == 2  # the hung worker killed, the crashed one replaced
        assert all(w.proc.poll() is None for w in scorer.pool.workers)
    finally:
        scorer.close()


def test_pool_workers_outlast_a_process_group_signal_and_an_idle_worker_death(reward_file):
    import os
    import signal

    fn = load_reward_fn(reward_file)
    scorer = RewardScorer(fn, spec=reward_file, num_workers=2, timeout_s=5)
    try:
        scorer.score(["4"], [ROW])  # start the workers
        while not all(w.ready for w in scorer.pool.workers):  # both have loaded the function
            scorer.score(["4", "4"], [{**ROW, "delay": 0.1}] * 2)
        # Ctrl-C in a terminal signals its process group: the workers are not in it.
        assert all(os.getpgid(w.proc.pid) != os.getpgrp() for w in scorer.pool.workers)
        # A scheduler's SIGTERM (or a SIGINT) to every process: calls still finish;
        # the driver decides whether the run stops.
        for w in scorer.pool.workers:
            os.kill(w.proc.pid, signal.SIGINT)
            os.kill(w.proc.pid, signal.SIGTERM)
        scores, metrics = scorer.score(["4", "4"], [{**ROW, "delay": 0.3}] * 2)
        assert scores["total"] == [1.0, 1.0] and metrics["reward/errors"] == 0
        assert scorer.pool.restarts == 0

        # A worker killed between calls: its next call goes to a replacement.
        dead = scorer.pool.workers[0].proc
        dead.kill()
        dead.wait()
        scores, metrics = scorer.score(["4", "4", "x"], [ROW] * 3)
        assert scores["total"] == [1.0, 1.0, 0.0] and metrics["reward/errors"] == 0
        assert scorer.pool.restarts == 1
    finally:
        scorer.close()


# -- functions written for TRL's GRPOTrainer and for verl ---------------------------------


def test_trl_style_rewards_run_unchanged_one_sample_per_call():
    def reward_len(completions, **kwargs):  # TRL's documentation example
        return [-abs(5 - len(c)) for c in completions]

    def accuracy(prompts, completions, answer, **kwargs):
        assert len(prompts) == len(completions) == len(answer) == 1
        return [float(c == a) + 0.1 * k for c, a, k in zip(completions, answer, kwargs["level"])]

    def chat_accuracy(completions, answer, **kwargs):
        return [float(c[0]["content"] == a) for c, a in zip(completions, answer)]

    assert call_plan(reward_len, COLUMNS).style == "trl"
    scores, metrics = RewardScorer(reward_len).score(["4", "12345678"], [ROW, ROW])
    assert scores["total"] == [-4.0, -3.0] and metrics["reward/errors"] == 0
    scores, _ = RewardScorer(accuracy).score(["4", "5"], [ROW, ROW])
    assert scores["total"] == [1.1, 0.1]
    # a chat prompt: completions come as assistant messages, as TRL passes them
    chat = {**ROW, "prompt": [{"role": "user", "content": "2+2="}]}
    scores, _ = RewardScorer(chat_accuracy).score(["4", "5"], [chat, chat])
    assert scores["total"] == [1.0, 0.0]


def test_trl_style_misfits_are_counted_or_named():
    def two_values(completions, **kwargs):
        return [1.0, 2.0]

    scorer = RewardScorer(two_values, max_error_frac=1.0)
    scores, metrics = scorer.score(["4"], [ROW])
    assert scores["total"] == [0.0] and metrics["reward/errors"] == 1

    def wants_ids(completions, completion_ids, **kwargs):
        return [0.0]

    with pytest.raises(RewardError, match=r"TRL's GRPOTrainer.*nothing for \['completion_ids'\]"):
        call_plan(wants_ids, COLUMNS)
    with pytest.raises(RewardError, match=r"1 of 1 calls failed.*TRL's style"):
        RewardScorer(two_values, max_error_frac=0.5).score(["4"], [ROW])


def test_verl_compute_score_runs_unchanged():
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        bonus = 0.5 if (extra_info or {}).get("split") == "train" else 0.0
        return {"score": float(solution_str == ground_truth) + bonus, "acc": True, "pred": "x"}

    verl_row = {
        "data_source": "arith",
        "prompt": [{"role": "user", "content": "2+2="}],
        "reward_model": {"style": "rule", "ground_truth": "4"},
        "extra_info": {"split": "train"},
    }
    assert call_plan(compute_score, set(verl_row)).style == "verl"
    scores, metrics = RewardScorer(compute_score).score(["4", "5"], [verl_row, verl_row])
    assert scores["total"] == [1.5, 0.5] and metrics["reward/errors"] == 0
    # rlpost's own layout: the ground truth is the 'answer' column
    scores, _ = RewardScorer(compute_score).score(["4", "5"], [ROW, ROW])
    assert scores["total"] == [1.0, 0.0]
    with pytest.raises(RewardError, match=r"written for verl.*no ground truth"):
        call_plan(compute_score, {"prompt"})
