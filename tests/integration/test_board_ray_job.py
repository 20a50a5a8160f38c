"""The board launches runs as Ray jobs on a real cluster and follows and stops them.

A head node with the dashboard starts as ``ray start --head`` starts for a user
with a Ray token (token authentication on, as in test_ray_job.py); the board
runs as that user (the token in ``~/.ray/auth_token``) with ``--allow-launch``
and is driven through its HTTP forms, as the launch page posts them, with
``target=ray`` and the dashboard's address. The job's driver runs on this
machine, so the run directory the board names (absolute, under its runs root)
is where the job writes and where the board reads.

- A 2-step run: the board shows it running, then finished, listed with its
  step count and its held-out headline.
- A 200-step run whose steps outlast Ray's default stop wait (a reward that
  takes 4 s a step), stopped as a step begins: the board's stop makes Ray send
  SIGTERM; the run ends the step in progress, checkpoints it and exits, and the
  board shows it stopped with that checkpoint. Ray would SIGKILL it 3 s after
  the SIGTERM but for the wait the board submits with
  (``RAY_JOB_STOP_WAIT_TIME_S``).

Both jobs run on the cluster at once (the second starts while the first trains).
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytest.importorskip("ray")

from ray_nodes import REPO, RayNode, free_port, node_env, ray_head  # noqa: E402

# The smallest runs; rollout.name=hf starts in half the time of vLLM on a CPU (the
# board follows the job, whatever samples; test_ray_job.py runs vLLM in a job).
SMALL = [
    "data.prompts_per_step=2", "rollout.n=2", "data.val_size=2", "trainer.val_every=0",
    "trainer.save_final=false", "rollout.name=hf",
]  # fmt: skip
# 2 prompts x 2 samples, scored one at a time: a step outlasts Ray's 3 s stop wait.
SCORE_S = 1.0
SLOW_REWARD = (
    f"import time\n\ndef score(completion, row):\n    time.sleep({SCORE_S})\n    return 0.0\n"
)


@dataclass
class Board:
    """The board under test, its runs root and the cluster it launches on."""

    url: str
    runs: Path
    address: str  # the cluster's dashboard (Jobs API)
    head: RayNode
    model: Path
    slow_reward: Path
    csrf: str = ""
    launched: float = 0.0  # when the first job was launched (time.monotonic)
    seen: dict[str, list[str]] = field(default_factory=dict)  # statuses, in order

    def post(self, path: str, form: dict[str, str]) -> tuple[str, str]:
        """(the URL it ended on, the page) after posting ``form`` as the page does."""
        data = urllib.parse.urlencode({**form, "csrf": self.csrf}).encode()
        with urllib.request.urlopen(self.url + path, data=data, timeout=60) as r:
            return r.geturl(), r.read().decode()

    def get(self, path: str) -> str:
        with urllib.request.urlopen(self.url + path, timeout=60) as r:
            return r.read().decode()

    def status(self, name: str) -> str:
        """The status the run page polls (``/api/metrics``), kept in ``seen``."""
        status = json.loads(self.get(f"/api/metrics?run={name}"))["status"][name]
        seen = self.seen.setdefault(name, [])
        if not seen or seen[-1] != status:
            seen.append(status)
        return status

    def launch(self, name: str, steps: int, *extra: str) -> None:
        end, page = self.post("/launch", {
            "name": name, "key.trainer.total_steps": str(steps), "extra": "\n".join(extra),
            "target": "ray", "address": self.address, "action": "launch",
        })  # fmt: skip
        assert end.endswith(f"/run?run={name}"), page[-3000:]

    def wait(self, done, name: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            log = self.runs / name / "board.log"
            assert time.monotonic() < deadline, (
                f"{name}: {self.seen.get(name)}\n{log.read_text()[-3000:] if log.exists() else ''}"
                f"\n{self.head.logs()}"
            )
            time.sleep(0.5)

    def row(self, name: str) -> str:
        """The runs page's row of ``name``, as text."""
        for tr in re.findall(r"<tr>(.*?)</tr>", self.get("/"), re.S):
            if f">{name}</a>" in tr:
                return html.unescape(re.sub(r"<[^>]+>", " ", tr))
        raise AssertionError(f"{name} not listed")


def metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().split("\n")[:-1] if path.exists() else []
    return [json.loads(line) for line in lines if line.strip()]


def _build_model(path: Path) -> None:
    from rlpost.models.tiny import build_tiny_model

    build_tiny_model("micro", path, seed=0)


@pytest.fixture(scope="module")
def board(tmp_path_factory) -> Iterator[Board]:
    tmp = tmp_path_factory.mktemp("board-ray")
    model = tmp / "model"
    # built while the head starts (torch's import alone is seconds on two cores)
    build = threading.Thread(target=_build_model, args=(model,))
    build.start()
    home = tmp / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(os.urandom(32).hex())
    (tmp / "slow.py").write_text(SLOW_REWARD)
    runs = tmp / "runs"
    runs.mkdir()
    env = {**node_env(), "HOME": str(home)}
    env.pop("RAY_AUTH_MODE")  # as a user's shell: the board finds the token itself
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlpost.board", "--runs", str(runs), "--port", str(free_port()),
         "--allow-launch"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO,
    )  # fmt: skip
    dashboard = free_port()
    try:
        with ray_head(num_cpus=4, dashboard_port=dashboard, home=home) as (head, _):
            build.join()
            assert (model / "config.json").exists(), "the model was not built"
            assert "Token authentication is enabled" in head.logs()
            assert proc.stdout is not None
            url = re.search(r"(http://\S+)", proc.stdout.readline())
            assert url, "the board printed no URL"
            address = f"http://127.0.0.1:{dashboard}"
            b = Board(url.group(1).rstrip("/"), runs, address, head, model, tmp / "slow.py")
            csrf = re.search(r'name="csrf" value="([^"]+)"', b.get("/launch"))
            assert csrf, "no form on the launch page"
            b.csrf = csrf.group(1)
            yield b
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def jobs(board: Board) -> Board:
    """Both runs launched from the board's form, one after the other."""
    model = f"model.path={board.model}"
    board.launched = time.monotonic()
    board.launch("done", 2, model, *SMALL)
    board.launch("stopped", 200, model, *SMALL, "trainer.save_every=0", "reward=custom",
                 f"reward.fn={board.slow_reward}:score", "reward.num_workers=1")  # fmt: skip
    return board


def test_a_ray_job_is_followed_from_running_to_finished_and_listed(jobs: Board):
    run_dir = jobs.runs / "done"
    record = json.loads((run_dir / "board.json").read_text())
    assert record["kind"] == "ray" and record["address"] == jobs.address
    # The command shown is the `ray job submit` a user could type for the same job.
    assert record["shown"].startswith(
        f"RAY_AUTH_MODE=token ray job submit --address {jobs.address} "
        f"--submission-id {record['job_id']} --runtime-env-json "
    )
    assert f"trainer.run_dir={run_dir.resolve()}" in record["shown"]
    jobs.wait(lambda: jobs.status("done") not in ("running", "unknown"), "done")
    took = time.monotonic() - jobs.launched
    assert jobs.seen["done"][-2:] == ["running", "finished"], jobs.seen["done"]
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2]
    # The job's log, copied from the cluster, is the run's log on the board.
    log = jobs.get("/api/log?run=done")
    assert "done: val/accuracy" in log and f"run dir {run_dir.resolve()}" in log
    assert "Connecting to existing Ray cluster" in log  # the job joined the cluster
    val = [r["val/accuracy"] for r in rows if "val/accuracy" in r]
    row = jobs.row("done")
    assert "finished" in row and "2 / 2" in row
    assert f"val/accuracy {val[0]:.3f} → {val[-1]:.3f}" in row, row
    print(f"launched as a Ray job: finished on the board {took:.1f} s after the launch")


def test_the_boards_stop_checkpoints_a_ray_job_mid_step(jobs: Board):
    run_dir = jobs.runs / "stopped"
    jobs.wait(lambda: len(metrics(run_dir)) >= 2, "stopped")  # step 1 done
    assert jobs.status("stopped") == "running"
    page = jobs.get("/run?run=stopped")
    assert "stop (ray job stop, SIGTERM: checkpoint, then exit)" in page
    # Stop as a step begins: its scoring alone outlasts Ray's default wait.
    done = len(metrics(run_dir))
    deadline = time.monotonic() + 60
    while len(metrics(run_dir)) == done and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(metrics(run_dir)) > done, (run_dir / "board.log").read_text()[-3000:]
    sent, sent_at = time.monotonic(), time.time()
    _, answer = jobs.post("/stop", {"run": "stopped"})
    assert "Ray sends it SIGTERM" in answer, answer
    jobs.wait(lambda: jobs.status("stopped") != "running", "stopped", timeout=120)
    stop_s = time.monotonic() - sent
    assert jobs.seen["stopped"][-2:] == ["running", "stopped"], jobs.seen["stopped"]
    last = metrics(run_dir)[-1]["step"]
    assert 2 <= last < 200
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [f"step_{last:06d}"]
    complete = run_dir / "checkpoints" / f"step_{last:06d}" / "COMPLETE"
    # Written past the 3 s after which Ray, by default, SIGKILLs a job it stops.
    saved_s = complete.stat().st_mtime - sent_at
    assert saved_s > 3.0, saved_s
    log = (run_dir / "board.log").read_text()
    # It exited by itself after the checkpoint, not killed by Ray's SIGKILL.
    assert f"stopped by SIGTERM after step {last} (checkpoint " in log, log[-3000:]
    row = jobs.row("stopped")
    assert "stopped" in row and f"checkpoint of step {last}" in row and f"{last} / 200" in row
    page = jobs.get("/run?run=stopped")
    checkpoint = run_dir.resolve() / "checkpoints" / f"step_{last:06d}"
    assert f"checkpoint of step {last}: <code>{checkpoint}</code>" in page
    assert 'action="/stop"' not in page  # no stop button once stopped
    print(f"stopped from the board: checkpoint of step {last} written {saved_s:.1f} s and "
          f"stopped on the board {stop_s:.1f} s after the stop")  # fmt: skip
