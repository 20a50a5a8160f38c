"""Bad user input stops the CLI before Ray starts: exit code 2, a message that
names what to change, in seconds, with no Ray session and no run directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Parsing plus the heavy imports (torch, transformers, ray) take ~5 s on two cores.
FAST_S = 15.0

REWARD_PY = "def score(completion, row):\n    return 0.0\n"


def run_cli(args: list[str], tmp: Path) -> tuple[subprocess.CompletedProcess, float, Path]:
    ray_tmp = Path(tempfile.mkdtemp(prefix="rlpost-ray-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_TMPDIR"] = str(ray_tmp)
    cmd = [sys.executable, "-m", "rlpost.main", *args]
    cmd += [f"trainer.run_dir={tmp / 'run'}", f"model.cache_dir={tmp / 'cache'}"]
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        seconds = time.monotonic() - start
        # Ray creates <RAY_TMPDIR>/ray/session_* as it starts (test_custom_data checks this).
        ray_started = (ray_tmp / "ray").exists()
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert not ray_started, proc.stderr[-2000:]
    return proc, seconds, tmp / "run"


CASES = {
    "missing_train_file": (
        ["data=files", "data.train_files=[/nope.jsonl]", "data.val_files=[/nope2.jsonl]"],
        # Both files are reported in one message.
        ["/nope.jsonl", "no such file", "data.train_files", "/nope2.jsonl", "data.val_files"],
    ),
    "several_problems_at_once": (
        ["model.path=./does-not-exist", "reward=custom", "reward.fn=/nope.py:fn"],
        ["model.path='./does-not-exist'", "reward.fn:", "/nope.py"],
    ),
    "missing_reward_file": (
        ["reward=custom", "reward.fn=/nope.py:fn"],
        ["/nope.py", "does not exist", "fix the path"],
    ),
    "missing_reward_function": (
        ["reward=custom", "reward.fn={reward_py}:missing_function"],
        # The message lists the functions the file does define.
        ["missing_function", "has no attribute", "['score']"],
    ),
    "missing_model_dir": (
        ["model.path=./does-not-exist"],
        ["model.path='./does-not-exist'", "config.json"],
    ),
    # The user's files without data=files would train on the built-in task.
    "data_files_without_data_files_preset": (
        [
            "data.train_files=[{tmp}/rows.jsonl]",
            "data.val_files=[{tmp}/rows.jsonl]",
            "reward=custom",
            "reward.fn={reward_py}:score",
        ],
        ["data.train_files=", "data.val_files=", "add data=files"],
    ),  # fmt: skip
    # A keyword-style reward naming a column the rows lack (one path, not a list).
    "reward_names_a_missing_column": (
        [
            "data=files",
            "data.train_files={tmp}/rows.jsonl",
            "data.val_files={tmp}/rows.jsonl",
            "reward=custom",
            "reward.fn={tmp}/keyword.py:score",
        ],
        ["reward.fn=", "difficulty", "answer", "prompt"],
    ),  # fmt: skip
    "lora_adapter_on_a_moe_model_on_the_cpu": (
        ["model.path={tmp}/moe", "model.lora.rank=8", "rollout.lora_sync=adapter"],
        ["rollout.lora_sync=adapter", "mixture-of-experts", "use rollout.lora_sync=merged"],
    ),
}
ROWS_JSONL = '{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": "4"}\n'
KEYWORD_PY = "def score(completion, difficulty, **row):\n    return 0.0\n"
# Enough of a MoE model's config.json for the checks that run before any load.
MOE_CONFIG = (
    '{"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 4}'
)


def _case_files(tmp_path: Path) -> Path:
    """The files the cases name; returns the reward file."""
    reward_py = tmp_path / "reward.py"
    reward_py.write_text(REWARD_PY)
    (tmp_path / "rows.jsonl").write_text(ROWS_JSONL)
    (tmp_path / "keyword.py").write_text(KEYWORD_PY)
    (tmp_path / "moe").mkdir()
    (tmp_path / "moe" / "config.json").write_text(MOE_CONFIG)
    return reward_py


def _check_error(case: str, code: int, stderr: str) -> None:
    assert code == 2, stderr[-2000:]
    error_lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert error_lines, stderr[-2000:]
    for text in CASES[case][1]:
        assert text in stderr, (text, stderr[-2000:])
    assert "Traceback" not in stderr


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_exits_2_before_ray_starts(case, tmp_path, monkeypatch, capsys):
    """Every case through ``rlpost.main.main``, in this process (what the command runs,
    less the interpreter's start-up, which the test below times once)."""
    import ray

    from rlpost.main import main

    reward_py = _case_files(tmp_path)
    args = [a.format(reward_py=reward_py, tmp=tmp_path) for a in CASES[case][0]]
    monkeypatch.chdir(REPO)
    code = main(
        [*args, f"trainer.run_dir={tmp_path / 'run'}", f"model.cache_dir={tmp_path / 'cache'}"]
    )
    _check_error(case, code, capsys.readouterr().err)
    assert not ray.is_initialized()
    assert not (tmp_path / "run").exists()  # nothing written: no config.yaml, no metrics


def test_the_command_exits_2_in_seconds_without_a_ray_session(tmp_path):
    case = "several_problems_at_once"
    reward_py = _case_files(tmp_path)
    args = [a.format(reward_py=reward_py, tmp=tmp_path) for a in CASES[case][0]]
    proc, seconds, run_dir = run_cli(args, tmp_path)
    _check_error(case, proc.returncode, proc.stderr)
    assert seconds < FAST_S, seconds
    assert not run_dir.exists()
