"""``ray job submit``: the CLI runs as a Ray job on a running cluster.

A head node with the dashboard (the Jobs API lives there) starts on this
machine; the test submits ``python -m rlpost.main`` with the checkout as the
job's working directory, as ``examples/ray_job.sh`` does, waits for SUCCEEDED
and reads the run directory the job wrote.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("vllm")

from ray_nodes import REPO, free_port, ray_head  # noqa: E402

STEPS = 2


def wait_for_jobs_api(address: str, timeout: float = 60):
    from ray.job_submission import JobSubmissionClient

    deadline = time.monotonic() + timeout
    while True:
        try:
            return JobSubmissionClient(address)
        except (ConnectionError, RuntimeError):
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def test_job_trains_on_an_existing_cluster(tmp_path: Path):
    from ray.job_submission import JobStatus

    from rlpost.tiny import build_tiny_model

    model = build_tiny_model("micro", tmp_path / "model", seed=0)
    run_dir = tmp_path / "run"  # absolute: the job's cwd is a temporary copy of the checkout
    overrides = [
        "algo=grpo", f"model.path={model}", f"trainer.run_dir={run_dir}",
        f"trainer.total_steps={STEPS}", "trainer.val_every=1", "data.prompts_per_step=4",
        "rollout.n=2", "data.val_size=8", "rollout.kv_cache_gib=0.0625",
    ]  # fmt: skip
    dashboard = free_port()
    with ray_head(num_cpus=2, dashboard_port=dashboard) as (head, _):
        client = wait_for_jobs_api(f"http://127.0.0.1:{dashboard}")
        job = client.submit_job(
            entrypoint=" ".join([sys.executable, "-m", "rlpost.main", *overrides]),
            runtime_env={"working_dir": str(REPO), "excludes": [".git", "outputs"]},
        )
        deadline = time.monotonic() + 120
        while not (status := client.get_job_status(job)).is_terminal():
            assert time.monotonic() < deadline, client.get_job_logs(job)[-4000:]
            time.sleep(1)
        logs = client.get_job_logs(job)
        assert status == JobStatus.SUCCEEDED, logs[-4000:] + head.logs()
        head_node = client.get_job_info(job).driver_node_id

    # The job's progress and closing line are in the job's log.
    assert "done: val/accuracy" in logs
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
    assert set(placement["nodes"]) == {head_node}
    assert (run_dir / "final" / "config.json").exists()
