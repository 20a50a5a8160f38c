"""A first real task through the CLI: a saved dataset with its own column names,
a prompt template and a system prompt, two weighted reward functions, a
reward model on its own worker and a generative judge on its own engine, and
the samples it wrote. One short run (module fixture) on tiny random models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("vllm")
datasets = pytest.importorskip("datasets")

from rlpost.models.tiny import build_tiny_model, build_tiny_reward_model  # noqa: E402
from tests.cli_in_process import main_in_process  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
STEPS, N, LOG = 2, 2, 8  # LOG: every sample of a step (4 prompts x N)
WORDS = ["abc", "xyz", "hello", "rl"]

REWARDS_PY = """
def exact(completion, row):
    return float(completion.strip() == row["answer"])


def ascii(completion, row):
    return {"ascii_mean": sum(map(ord, completion)) / (127 * max(len(completion), 1))}


def verdict_length(verdict):
    # a random judge writes random text: its length is the score; a verdict that is
    # shorter than the judge's max_tokens (an end token, or special tokens) fails
    return float(len(verdict)) if len(verdict) >= 6 else None
"""
JUDGE_TOKENS = 6


def rows(words):
    return [{"question": w, "solution": w[::-1], "data_source": "reverse"} for w in words]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = tmp_path_factory.mktemp("first_task")
    datasets.Dataset.from_list(rows(WORDS)).save_to_disk(str(tmp / "train"))
    for i, word in enumerate(["dog", "moon"]):  # held-out rows in two parquet shards
        pq.write_table(pa.Table.from_pylist(rows([word])), tmp / f"val-{i:05d}.parquet")
    (tmp / "rewards.py").write_text(REWARDS_PY)
    model = build_tiny_model("micro", tmp / "model", seed=0)
    reward_model = build_tiny_reward_model("micro", tmp / "rm", seed=1)
    judge = build_tiny_model("micro", tmp / "judge", seed=2)
    cmd = [
        f"model.path={model}", "data=files",
        f"data.train_files=[{tmp / 'train'}]", f"data.val_files=[{tmp}/val-*.parquet]",
        "data.prompt_template=Reverse: {question}", "data.answer_key=solution",
        "data.system_prompt=Reverse the letters.", f"data.prompts_per_step={len(WORDS)}",
        "reward=custom", f"reward.fn=[{tmp / 'rewards.py'}:exact,{tmp / 'rewards.py'}:ascii]",
        "reward.weights.exact=2.0", f"reward.model.path={reward_model}", "reward.model.name=rm",
        "reward.weights.rm=0.1", "reward.model.batch_size=3", f"reward.judge.path={judge}",
        "reward.judge.template=Grade {completion} for {question}",
        f"reward.judge.parse={tmp / 'rewards.py'}:verdict_length", "reward.weights.judge=0.01",
        f"reward.judge.max_tokens={JUDGE_TOKENS}", "reward.judge.temperature=1.0",
        "reward.max_error_frac=1.0", f"rollout.n={N}", f"trainer.total_steps={STEPS}",
        "trainer.val_every=1", f"trainer.log_samples={LOG}", f"trainer.run_dir={tmp / 'run'}",
        "trainer.logger=[console,jsonl,wandb]", f"model.cache_dir={tmp / 'cache'}",
    ]  # fmt: skip
    # in this process (tests/cli_in_process.py): the run, not the process, is tested here
    proc = main_in_process(cmd, {"RAY_ADDRESS": None, "WANDB_MODE": "offline"}, cwd=REPO)
    return proc, tmp / "run"


def history(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_each_reward_is_counted_and_weighed(run):
    proc, run_dir = run
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    for h in history(run_dir)[1:]:
        assert h["reward/exact/errors"] == 0 and h["reward/ascii/errors"] == 0
        assert h["reward/rm/errors"] == 0
        # total = 2 exact + ascii_mean + 0.1 rm + 0.01 judge: the means add up the same way
        expected = 2.0 * h["reward/exact/mean"] + h["reward/ascii_mean/mean"]
        expected += 0.1 * h["reward/rm/mean"] + 0.01 * h["reward/judge/mean"]
        assert h["reward/mean"] == pytest.approx(expected)
        assert 0 < h["reward/ascii_mean/mean"] <= 1 and h["reward/rm/mean"] != 0
    placement = json.loads((run_dir / "placement.json").read_text())
    assert placement["roles"]["reward_model"]["bundles"] == [{"CPU": 1.0}]
    assert placement["roles"]["judge"]["bundles"] == [{"CPU": 1.0}]


def test_samples_are_written_with_what_they_were_scored(run):
    proc, run_dir = run
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    samples = run_dir / "samples"
    names = sorted(p.name for p in samples.iterdir())
    assert names == ["step_000001.jsonl", "step_000002.jsonl"] + [
        f"val_{s:06d}.jsonl" for s in range(STEPS + 1)
    ]
    step = [json.loads(line) for line in (samples / "step_000001.jsonl").read_text().splitlines()]
    assert len(step) == LOG and [s["group"] for s in step][:3] == [0, 0, 1]  # N=2 a group
    # the judge's verdicts: max_tokens characters, or an error (scored 0)
    judged = [s["rewards"]["judge"] for s in step]
    assert all(v in (0.0, JUDGE_TOKENS) for v in judged)
    errors = {h["step"]: h["reward/judge/errors"] for h in history(run_dir)[1:]}
    assert errors[1] == sum(v == 0 for v in judged)
    for s in step:
        assert s["prompt"][0] == {"role": "system", "content": "Reverse the letters."}
        word = s["prompt"][1]["content"].removeprefix("Reverse: ")
        assert word in WORDS and s["answer"] == word[::-1] and s["data_source"] == "reverse"
        rewards = s["rewards"]
        assert set(rewards) == {"total", "exact", "ascii_mean", "rm", "judge"}
        total = 2 * rewards["exact"] + rewards["ascii_mean"] + 0.1 * rewards["rm"]
        total += 0.01 * rewards["judge"]
        assert rewards["total"] == pytest.approx(total)
        assert isinstance(s["advantage"], float) and s["length"] >= 1
        assert s["policy_version"] == 0 and s["finish_reason"] in ("stop", "length")
    val = [json.loads(line) for line in (samples / "val_000002.jsonl").read_text().splitlines()]
    assert sorted(v["answer"] for v in val) == ["god", "noom"]


def test_bad_reward_and_column_names_are_config_errors(tmp_path):
    datasets.Dataset.from_list(rows(WORDS)).save_to_disk(str(tmp_path / "train"))
    (tmp_path / "rewards.py").write_text(REWARDS_PY)
    cmd = [
        sys.executable, "-m", "rlpost.main", "data=files",
        f"data.train_files=[{tmp_path / 'train'}]", f"data.val_files=[{tmp_path / 'train'}]",
        "data.prompt_template=Reverse: {word}", "reward=custom",
        f"reward.fn=[{tmp_path / 'rewards.py'}:exact,maths]",
    ]  # fmt: skip
    env = {**os.environ, "RAY_ADDRESS": ""}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "'maths' is not a built-in reward" in proc.stderr
    assert "data.prompt_template" in proc.stderr and "no column 'word'" in proc.stderr
