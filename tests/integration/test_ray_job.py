"""``ray job submit``: the CLI runs as a Ray job on a running cluster.

A head node with the dashboard (the Jobs API lives there) starts on this
machine the way ``ray start --head`` starts for a user who has a Ray token
(token authentication on). ``examples/ray_job.sh`` submits ``python -m
rlpost.main`` with the checkout as the job's working directory, from a shell
without ``RAY_AUTH_MODE``, waits for the job, and the test reads the run
directory the job wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("vllm")

from ray_nodes import RAY, REPO, free_port, node_env, ray_head  # noqa: E402

STEPS = 2


def test_example_script_trains_as_a_job_on_a_token_auth_cluster(tmp_path: Path):
    from rlpost.models.tiny import build_tiny_model

    model = build_tiny_model("micro", tmp_path / "model", seed=0)
    run_dir = tmp_path / "run"  # absolute: the job's cwd is a temporary copy of the checkout
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    # A user's machine has a token once any local Ray started there; with one,
    # `ray start --head` turns token authentication on.
    (home / ".ray" / "auth_token").write_text(os.urandom(32).hex())
    dashboard = free_port()
    with ray_head(num_cpus=2, dashboard_port=dashboard, home=home) as (head, _):
        assert "Token authentication is enabled" in head.logs()
        env = {**node_env(), "HOME": str(home), "RAY": RAY, "RUN_DIR": str(run_dir)}
        env.pop("RAY_AUTH_MODE")  # the script works it out
        env["RAY_ADDRESS"] = f"http://127.0.0.1:{dashboard}"
        proc = subprocess.run(
            ["bash", str(REPO / "examples" / "ray_job.sh"), f"model.path={model}",
             f"trainer.total_steps={STEPS}", "trainer.val_every=1", "data.prompts_per_step=4",
             "rollout.n=2", "data.val_size=8", "rollout.kv_cache_gib=0.0625"],
            capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
        )  # fmt: skip
        logs = proc.stdout + proc.stderr
        assert proc.returncode == 0, logs[-4000:] + head.logs()

    # The job's progress and closing line are in the job's log, streamed by submit.
    assert "succeeded" in logs and "done: val/accuracy" in logs
    assert f"run dir {run_dir}" in logs
    history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [h["step"] for h in history] == list(range(STEPS + 1))
    val = [h["val/accuracy"] for h in history if "val/accuracy" in h]
    assert len(val) == STEPS + 1 and all(0.0 <= v <= 1.0 for v in val)
    # The replica sampled from the trainer's weights (weight sync worked inside the job).
    assert max(h["rollout/logprob_abs_diff_max"] for h in history[1:]) < 1e-3
    # Its workers ran on the cluster's (only) node, not on a Ray of the job's own.
    placement = json.loads((run_dir / "placement.json").read_text())
    assert set(placement["roles"]) == {"policy", "rollout"}
    assert len(set(placement["nodes"])) == 1
    assert "Started a local Ray instance" not in logs
    assert (run_dir / "final" / "config.json").exists()
