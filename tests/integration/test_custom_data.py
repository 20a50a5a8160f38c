"""The real CLI on user files and a user reward: ``data=files reward=custom``.

One run (module fixture) on a tiny random model, checked from its outputs:

- train rows come from JSONL with two malformed rows, held-out rows from
  Parquet, all prompts as chat messages;
- the reward raises on rows marked ``boom`` and returns two named rewards on
  the others; the data makes the number of raising samples per step exact;
- ``config.yaml``, ``metrics.jsonl``, ``curves.png``, ``final/`` and the
  offline wandb run (``trainer.logger`` includes wandb, ``WANDB_MODE`` unset).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml

pytest.importorskip("ray")
pytest.importorskip("vllm")
pytest.importorskip("wandb")

from rlpost.config.compose import from_dict
from rlpost.models.tiny import build_tiny_model  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

PROMPTS_PER_STEP = 4
N = 2
STEPS = 2
BOOM_MESSAGE = "boom: this row is marked to fail"

REWARD_PY = f'''
def fn(completion, row):
    if row.get("boom"):
        raise ValueError("{BOOM_MESSAGE}")
    # ascii_mean differs between almost any two sampled completions, so each
    # group of non-boom samples has a nonzero advantage and the policy moves.
    return {{
        "exact": float(completion.strip() == row["answer"]),
        "ascii_mean": sum(map(ord, completion)) / (127 * max(len(completion), 1)),
    }}
'''


def chat(text: str) -> list[dict]:
    return [
        {"role": "system", "content": "Reverse the letters."},
        {"role": "user", "content": text},
    ]


# Exactly PROMPTS_PER_STEP valid rows: every step's batch is all of them (one
# shuffled epoch per step), so every step sees the 2 boom rows.
TRAIN_ROWS = [
    {"prompt": chat("abc"), "answer": "cba", "boom": True},
    {"prompt": chat("xyz"), "answer": "zyx", "boom": True},
    {"prompt": chat("hello"), "answer": "olleh", "boom": False},
    {"prompt": chat("rl"), "answer": "lr", "boom": False},
    {"question": "no prompt field", "answer": "x", "boom": False},  # malformed
    {"prompt": 42, "answer": "x", "boom": False},  # malformed: wrong type
]
BOOM_ROWS = sum(1 for r in TRAIN_ROWS[:PROMPTS_PER_STEP] if r["boom"])
VAL_ROWS = [
    {"prompt": chat("dog"), "answer": "god", "boom": False},
    {"prompt": chat("ab"), "answer": "ba", "boom": False},
    {"prompt": chat("moon"), "answer": "noom", "boom": False},
]


@dataclass
class Run:
    proc: subprocess.CompletedProcess
    output: str
    run_dir: Path
    init_model: Path
    ray_tmp: Path
    reward_spec: str
    seconds: float

    def metrics(self) -> list[dict]:
        lines = (self.run_dir / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]


def cli_env(ray_tmp: Path, tmp: Path) -> dict[str, str]:
    """The caller's environment without WANDB_MODE or a Ray address; Ray and
    wandb keep their files under temporary directories."""
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_MODE", "RAY_ADDRESS")}
    env["RAY_TMPDIR"] = str(ray_tmp)
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        env[name] = str(tmp / name.lower())
    return env


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Iterator[Run]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = tmp_path_factory.mktemp("custom_data")
    train = tmp / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in TRAIN_ROWS))
    val = tmp / "val.parquet"
    pq.write_table(pa.Table.from_pylist(VAL_ROWS), val)
    (tmp / "reward.py").write_text(REWARD_PY)
    init_model = build_tiny_model("micro", tmp / "model", seed=0)
    run_dir = tmp / "run"
    # Ray's socket paths must stay short: a pytest tmp path can be too long.
    ray_tmp = Path(tempfile.mkdtemp(prefix="rlpost-ray-", dir="/tmp"))
    reward_spec = f"{tmp / 'reward.py'}:fn"
    cmd = [
        sys.executable, "-m", "rlpost.main",
        f"model.path={init_model}",
        "data=files",
        f"data.train_files=[{train}]",
        f"data.val_files=[{val}]",
        f"data.prompts_per_step={PROMPTS_PER_STEP}",
        "data.val_size=8",
        "reward=custom",
        f"reward.fn={reward_spec}",
        f"rollout.n={N}",
        f"trainer.total_steps={STEPS}",
        "trainer.val_every=1",
        "trainer.lr=1e-3",
        "trainer.lr_warmup_steps=0",
        f"trainer.run_dir={run_dir}",
        "trainer.logger=[console,jsonl,wandb]",
        f"model.cache_dir={tmp / 'cache'}",
    ]  # fmt: skip
    start = time.monotonic()
    proc = subprocess.run(
        cmd, cwd=REPO, env=cli_env(ray_tmp, tmp), capture_output=True, text=True, timeout=300
    )
    seconds = time.monotonic() - start
    yield Run(proc, proc.stdout + proc.stderr, run_dir, init_model, ray_tmp, reward_spec, seconds)
    shutil.rmtree(ray_tmp, ignore_errors=True)


def test_run_succeeds_and_starts_ray_under_ray_tmpdir(run):
    assert run.proc.returncode == 0, run.output[-4000:]
    # Ray honours RAY_TMPDIR; test_cli_errors relies on that to show Ray never started.
    assert list((run.ray_tmp / "ray").glob("session_*")), run.output[-2000:]


def test_a_reward_without_correctness_reports_its_mean_not_an_accuracy(run):
    # The reward names 'exact' and 'ascii_mean', no 'correctness': the held-out
    # figure is the mean reward under its own name, never called an accuracy.
    assert run.proc.returncode == 0, run.output[-4000:]
    val = [h for h in run.metrics() if "val/reward_mean" in h]
    assert [h["step"] for h in val] == list(range(STEPS + 1))  # trainer.val_every=1
    assert not any("val/accuracy" in h for h in run.metrics())
    assert "done: val/reward_mean" in run.output


def test_malformed_rows_and_reward_errors_are_counted(run):
    assert run.proc.returncode == 0, run.output[-4000:]
    history = run.metrics()
    assert [h["step"] for h in history] == list(range(STEPS + 1))
    for h in history[1:]:
        assert h["data/malformed_rows"] == 2
        # 2 boom rows x rollout.n = 2 samples raise in every step.
        assert h["reward/errors"] == BOOM_ROWS * N == 4
        assert "reward/exact/mean" in h and "reward/ascii_mean/mean" in h
        # A raising sample scores 0 under every name and the weights are 1.0
        # each, so the mean total is the sum of the named means.
        assert h["reward/mean"] == pytest.approx(
            h["reward/exact/mean"] + h["reward/ascii_mean/mean"]
        )
        # Half the samples score 0; the others' ascii_mean lies in (0, 1].
        assert 0 < h["reward/ascii_mean/mean"] <= 0.5
    for h in history:
        assert h["val/reward_errors"] == 0  # held-out rows carry boom=False
    # One warning for the one distinct failure message, not one per sample.
    assert run.output.count(BOOM_MESSAGE) == 1, run.output[-4000:]
    assert "skipped 2 malformed" in run.output


def test_outputs_config_curves_and_trained_final_model(run):
    from transformers import AutoModelForCausalLM

    assert run.proc.returncode == 0, run.output[-4000:]
    raw = yaml.safe_load((run.run_dir / "config.yaml").read_text())
    cfg = from_dict(raw)  # the saved config validates as it is
    assert cfg.reward.fn == run.reward_spec
    assert cfg.data.name == "files" and cfg.data.prompts_per_step == PROMPTS_PER_STEP
    assert (run.run_dir / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    final = AutoModelForCausalLM.from_pretrained(run.run_dir / "final")
    initial = AutoModelForCausalLM.from_pretrained(run.init_model)
    before, after = initial.state_dict(), final.state_dict()
    assert before.keys() == after.keys()
    change = max(float((after[k] - before[k]).abs().max()) for k in before)
    # Adam's first steps move each weight with a gradient by about lr = 1e-3.
    assert change > 1e-4, change
    assert all(torch.isfinite(v).all() for v in after.values())


# What Ray, vLLM, Triton and torch print in a run that a user cannot act on; each
# was in every run's console before the workers started quiet (WORKER_ENV, the
# rollout worker's own vLLM logger, the private Ray's token-auth logger).
NOISE = [
    "Token authentication is",  # the private Ray's token-auth note
    "doesn't include CPU backend",  # vLLM on Triton: "Triton is installed, but ..."
    "FutureWarning",  # a deprecation inside vLLM's Triton dispatcher
    "NUMA",  # torch's and vLLM's CPU binding notes
    "Loading safetensors checkpoint shards",  # vLLM's own load bar (ignores TQDM_DISABLE)
]


def test_the_console_holds_no_notes_a_user_cannot_act_on(run):
    assert run.proc.returncode == 0, run.output[-4000:]
    for note in NOISE:
        assert note not in run.output, (note, run.output[-4000:])
    # nor vLLM's INFO/WARNING records from the workers ("INFO 12-01 23:45:22 [file.py:12] ...")
    vllm_record = re.compile(r"Worker pid=\d+\).*\b(INFO|WARNING) \d\d-\d\d [\d:]{8} \[")
    assert not [ln for ln in run.output.splitlines() if vllm_record.search(ln)]


def test_wandb_logs_offline_under_the_run_dir(run):
    assert run.proc.returncode == 0, run.output[-4000:]
    runs = list((run.run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs
    (history,) = runs[0].glob("run-*.wandb")
    data = history.read_bytes()
    assert data.startswith(b":W&B")
    for key in (b"reward/errors", b"reward/ascii_mean/mean", b"val/reward_mean"):
        assert key in data
    # the console says where the offline run is and how to upload it
    assert f"wandb offline run: {runs[0]}; upload it with `wandb sync {runs[0]}`" in run.output
