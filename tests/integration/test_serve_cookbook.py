"""The tinker cookbook's RL recipe (``tinker_cookbook.recipes.math_rl.train``,
0.6.1), unchanged, against ``rlpost serve`` on this machine, offline: the command
serves the built-in model and puts its tokenizer in a Hugging Face cache under the
served name (``--hf-cache``), and the recipe -- its own process, the cookbook on
its ``PYTHONPATH`` as ``install.sh`` puts it in ``.cookbook`` -- samples, scores,
trains and saves its final checkpoint through the official SDK.

The cookbook's math recipes need an antlr4 that hydra's pin excludes, so it is
not in the test environment itself; without ``.cookbook`` this test is skipped."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("tinker")

from rlpost.serve.__main__ import BUILTIN  # noqa: E402

COOKBOOK = Path(__file__).resolve().parents[2] / ".cookbook"
STEPS = 3
GROUPS, GROUP_SIZE = 8, 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not (COOKBOOK / "tinker_cookbook").is_dir(),
                    reason="the tinker cookbook's folder .cookbook (install.sh) is absent")  # fmt: skip
def test_the_cookbook_rl_recipe_runs_unchanged_against_the_service(tmp_path):
    port, state = free_port(), tmp_path / "state"
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "TINKER_TELEMETRY": "0",
           "TQDM_DISABLE": "1"}  # fmt: skip
    server = subprocess.Popen(
        [sys.executable, "-m", "rlpost.serve", "--port", str(port), "--state-dir", str(state),
         "--hf-cache"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    said = []
    try:
        assert server.stdout is not None
        deadline = time.monotonic() + 120
        while not any(" on http://" in line for line in said):
            line = server.stdout.readline()
            assert line and time.monotonic() < deadline, "".join(said)[-3000:]
            said.append(line)
        assert any(f"the tokenizer of {BUILTIN} in " in line for line in said), said
        log = tmp_path / "recipe"
        recipe = subprocess.run(
            [sys.executable, "-m", "tinker_cookbook.recipes.math_rl.train",
             f"base_url=http://127.0.0.1:{port}", f"model_name={BUILTIN}",
             "renderer_name=role_colon", "env=arithmetic", "loss_fn=importance_sampling",
             f"groups_per_batch={GROUPS}",
             f"group_size={GROUP_SIZE}", f"max_steps={STEPS}", f"log_path={log}",
             "behavior_if_log_dir_exists=delete", "lora_rank=8", "learning_rate=1e-3",
             "eval_every=0", "save_every=0"],
            env={**env, "PYTHONPATH": str(COOKBOOK), "HF_HUB_OFFLINE": "1",
                 "TINKER_API_KEY": "tml-rlpost-test"},
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert recipe.returncode == 0, (recipe.stdout + recipe.stderr)[-4000:]
    finally:
        server.terminate()
        server.wait(timeout=30)
    rows = [json.loads(line) for line in (log / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "env/all/total_episodes" in r]  # not the closing token count
    assert [r["step"] for r in rows] == list(range(STEPS))
    for r in rows:
        # every sample was scored by the recipe's environment ...
        assert r["env/all/total_episodes"] == GROUPS * GROUP_SIZE
        # ... and the service's trainer gave the sampled tokens the log-probs its
        # sampler did: the cookbook's own KL(sampler || trainer) estimate
        assert abs(r["optim/kl_sample_train_v1"]) < 1e-4, r
    final = [json.loads(line) for line in (log / "checkpoints.jsonl").read_text().splitlines()]
    assert final[-1]["name"] == "final" and final[-1]["state_path"].startswith("tinker://")
    # the tenant is on the board: one metrics row for each of the recipe's optimizer steps
    (tenant,) = (state / "runs").iterdir()
    steps = [json.loads(line) for line in (tenant / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    assert all(s["train/datums"] == GROUPS * GROUP_SIZE for s in steps)
