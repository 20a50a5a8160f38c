"""The board's Ray jobs against a stand-in for a cluster's Jobs REST API (the
routes and fields of Ray's dashboard): what it submits, how it reads a job's
status and log, how it stops one, and what it says when the cluster refuses.
tests/integration/test_board_ray_job.py runs the same against a real cluster."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rlpost.board import launch, ray_jobs
from rlpost.board.runs import describe_run

TOKEN = "secret-token"


class FakeJobs(BaseHTTPRequestHandler):
    """``/api/jobs/`` as Ray's dashboard answers it, token authentication on."""

    jobs: dict[str, dict] = {}
    submitted: list[dict] = []

    def _answer(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        given = self.headers.get("Authorization")
        if given is None:
            self._answer(401, "Unauthorized: Missing authentication token")
        elif given != f"Bearer {TOKEN}":
            self._answer(403, "Forbidden: Invalid authentication token")
        return given == f"Bearer {TOKEN}"

    def do_POST(self) -> None:
        if not self._authorized():
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path == "/api/jobs/":
            self.submitted.append(body)
            self.jobs[body["submission_id"]] = {"status": "RUNNING", "driver_exit_code": None}
            return self._answer(200, {"job_id": "02000000", "submission_id": body["submission_id"]})
        job = self.path.removeprefix("/api/jobs/").removesuffix("/stop")
        was = self.jobs[job]["status"] == "RUNNING"
        self.jobs[job]["status"] = "STOPPED"
        self._answer(200, {"stopped": was})

    def do_GET(self) -> None:
        if not self._authorized():
            return
        job, _, logs = self.path.removeprefix("/api/jobs/").partition("/")
        if job not in self.jobs:
            return self._answer(404, f"Job {job} does not exist")
        if logs:
            return self._answer(200, {"logs": f"step 1 of {job}\n"})
        self._answer(200, {"submission_id": job, "message": "", **self.jobs[job]})

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def cluster(monkeypatch, tmp_path) -> Iterator[str]:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.ray/auth_token of the machine's
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN", TOKEN)
    monkeypatch.setattr(launch, "RAY_POLL_S", 0.0)
    FakeJobs.jobs, FakeJobs.submitted = {}, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeJobs)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_job_is_submitted_followed_and_stopped_with_a_checkpoint(cluster, tmp_path: Path):
    run_dir = tmp_path / "runs" / "r1"
    launcher = launch.Launcher()
    overrides = ["trainer.total_steps=200", "reward.fn=/my rewards/r.py:score"]
    info = launcher.start_ray(run_dir, overrides, cluster, "rlpost-r1-1")
    [body] = FakeJobs.submitted
    # The shell command Ray runs: quoted as `ray job submit -- ...` quotes it (shlex.join).
    assert body["entrypoint"] == (
        "python -m rlpost.main trainer.total_steps=200 'reward.fn=/my rewards/r.py:score'"
    )
    # Ray's stop sends SIGTERM, then SIGKILL after RAY_JOB_STOP_WAIT_TIME_S (3 s by default).
    assert body["runtime_env"] == {"env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": "600"}}
    assert info["job_id"] == "rlpost-r1-1" and info["kind"] == "ray"
    assert json.loads((run_dir / "board.json").read_text())["address"] == cluster

    assert launcher.state(run_dir) == (None, True)
    launcher.refresh_log(run_dir)  # the run page's log: the job's, copied from the cluster
    assert (run_dir / "board.log").read_text() == "step 1 of rlpost-r1-1\n"
    message = launcher.stop(run_dir)
    assert message.startswith("asked Ray to stop job rlpost-r1-1: Ray sends it SIGTERM")
    # Ray reports STOPPED with no exit code: counted as 143 (SIGTERM), a stop.
    assert launcher.state(run_dir) == (143, False)
    assert json.loads((run_dir / "board.json").read_text())["exit_code"] == 143
    (run_dir / "checkpoints" / "step_000007").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_000007" / "COMPLETE").write_text("7")
    run = describe_run(tmp_path / "runs", run_dir, *launcher.state(run_dir))
    assert (run.status, run.checkpoint) == ("stopped", (7, "checkpoints/step_000007"))
    assert launch.Launcher().stop(run_dir) == "not running"  # known ended: nothing sent


def test_the_drivers_exit_code_decides_a_job_that_ended_by_itself(cluster, tmp_path: Path):
    launcher = launch.Launcher()
    cases: list[tuple[str, dict, int]] = [
        ("ok", {"status": "SUCCEEDED", "driver_exit_code": 0}, 0),
        ("bad-config", {"status": "FAILED", "driver_exit_code": 2}, 2),
        ("no-env", {"status": "FAILED", "driver_exit_code": None}, 1),  # runtime env failed
        ("term", {"status": "FAILED", "driver_exit_code": 143}, 143),  # SIGTERM from elsewhere
    ]
    for job, details, code in cases:
        run_dir = tmp_path / job
        launcher.start_ray(run_dir, [], cluster, job)
        FakeJobs.jobs[job] = details
        assert launcher.state(run_dir) == (code, False), job


def test_a_refused_or_unreachable_cluster_is_said_plainly(cluster, tmp_path: Path, monkeypatch):
    launcher = launch.Launcher()
    monkeypatch.setenv("RAY_AUTH_TOKEN", "wrong")
    with pytest.raises(ray_jobs.RayJobError, match="refused this board's token"):
        launcher.start_ray(tmp_path / "a", [], cluster, "a")
    assert not (tmp_path / "a").exists()  # nothing written for a job that never started
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    with pytest.raises(ray_jobs.RayJobError, match="uses token authentication and this board"):
        launcher.start_ray(tmp_path / "a", [], cluster, "a")
    # The token file `ray start --head` writes is found as Ray's clients find it.
    (tmp_path / "home" / ".ray").mkdir(parents=True)
    (tmp_path / "home" / ".ray" / "auth_token").write_text(TOKEN + "\n")
    launcher.start_ray(tmp_path / "a", [], cluster, "a")
    # A cluster that no longer answers: the status is left to the run's files.
    record = json.loads((tmp_path / "a" / "board.json").read_text())
    record["address"] = "127.0.0.1:1"  # no scheme: http:// is assumed
    (tmp_path / "a" / "board.json").write_text(json.dumps(record))
    assert launcher.state(tmp_path / "a") == (None, None)
    assert "cannot reach the Ray dashboard at 127.0.0.1:1" in launcher.stop(tmp_path / "a")


def test_the_shown_command_is_the_ray_job_submit_equal_to_the_submission(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    command = launch.ray_submit_command(["trainer.total_steps=2"], "http://h:8265", "rlpost-x")
    line = (
        "ray job submit --address http://h:8265 --submission-id rlpost-x --runtime-env-json "
        """'{"env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": "600"}}' --no-wait -- """
        "python -m rlpost.main trainer.total_steps=2"
    )
    assert launch.shown(command) == line  # no token at hand: Ray's default mode
    monkeypatch.setenv("RAY_AUTH_TOKEN", "t")
    assert launch.shown(command) == "RAY_AUTH_MODE=token " + line


def test_a_launch_the_cluster_refuses_is_shown_beside_the_address(cluster, tmp_path: Path):
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from rlpost.board.server import Board, make_app

    board = Board(root=tmp_path / "runs", allow_launch=True)
    board.root.mkdir()
    form = {"name": "r", "target": "ray", "address": "127.0.0.1:1", "action": "launch",
            "key.trainer.total_steps": "2", "csrf": board.csrf}  # fmt: skip

    async def post() -> str:
        async with TestClient(TestServer(make_app(board))) as client:
            response = await client.post("/launch", data=form, allow_redirects=False)
            assert response.status == 200
            return await response.text()

    page = asyncio.run(post())
    assert 'data-field="address"><li>cannot reach the Ray dashboard at 127.0.0.1:1' in page
    assert not (board.root / "r").exists()  # nothing launched, nothing written
