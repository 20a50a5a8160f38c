"""Running the real CLI on the micro model from the integration tests: the
command, its metrics, and the Ray processes a run started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.cli_in_process import Finished, main_in_process

COMMON = [
    "trainer.save_every=2", "trainer.val_every=2", "data.prompts_per_step=4", "rollout.n=4",
    "data.val_size=16", "rollout.kv_cache_gib=0.0625", "trainer.lr=1e-3",
]  # fmt: skip

# Completions of the random model differ in length: a reward with a signal in every group.
REWARD = "def score(completion, row):\n    return len(completion) / 8.0\n"

ENV = {**os.environ, "TQDM_DISABLE": "1"}


def cli_args(model: Path, run_dir: Path, steps: int, *extra: str) -> list[str]:
    """The CLI's arguments for ``model`` with a length reward, ``steps`` steps."""
    reward = run_dir.parent / "reward.py"
    reward.write_text(REWARD)
    return [f"model.path={model}", *COMMON, "reward=custom", f"reward.fn={reward}:score",
            f"trainer.total_steps={steps}", f"trainer.run_dir={run_dir}", *extra]  # fmt: skip


def cli_command(model: Path, run_dir: Path, steps: int, *extra: str) -> list[str]:
    """``python -m rlpost.main`` with ``cli_args``."""
    return [sys.executable, "-m", "rlpost.main", *cli_args(model, run_dir, steps, *extra)]


def run(model: Path, run_dir: Path, steps: int, *extra: str) -> list[dict]:
    """Run the CLI to the end (in this process: ``tests/cli_in_process.py``);
    returns its metrics rows."""
    proc = cli(cli_args(model, run_dir, steps, *extra))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return metrics(run_dir)


def cli(
    args: list[str], env: dict[str, str | None] | None = None, cwd: Path | str | None = None
) -> Finished:
    """``python -m rlpost.main *args`` run in this process, ``env`` added to the
    environment (None removes a variable): returncode, stdout and stderr as
    ``subprocess.run`` captures them."""
    return main_in_process(args, env, cwd)


def start(
    model: Path, run_dir: Path, steps: int, *extra: str, session: bool = False
) -> subprocess.Popen:
    """Start the CLI in the background; its output goes to ``run_dir``.log. ``session``:
    in a process group of its own, as a terminal starts a command (for ``os.killpg``)."""
    log = open(f"{run_dir}.log", "w")
    return subprocess.Popen(
        cli_command(model, run_dir, steps, *extra), stdout=log, stderr=subprocess.STDOUT, env=ENV,
        start_new_session=session,
    )  # fmt: skip


def output(run_dir: Path) -> str:
    return Path(f"{run_dir}.log").read_text()


def metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().split("\n")[:-1]  # complete lines only
    return [json.loads(line) for line in lines if line.strip()]


def wait_until(done: Callable[[], object], proc: subprocess.Popen, run_dir: Path,
               timeout: float = 300) -> None:  # fmt: skip
    """Poll ``done()`` while ``proc`` runs; fail with its output if it exits first."""
    deadline = time.monotonic() + timeout
    while not done():
        assert proc.poll() is None, f"exited with {proc.returncode}:\n{output(run_dir)[-3000:]}"
        assert time.monotonic() < deadline, f"timed out:\n{output(run_dir)[-3000:]}"
        time.sleep(0.05)


def comparable(row: dict) -> dict:
    """A metrics row without what differs between equal runs: timings, the request
    counters (since each replica started), the restart counters and the engines'
    load (the KV cache's peak use and preemptions follow how requests overlapped)."""
    load = ("/requests", "restarts", "kv_cache_usage_peak", "preemptions")
    return {
        k: v for k, v in row.items()
        if not k.startswith(("timing/", "perf/")) and not k.endswith(load)
    }  # fmt: skip


def descendants(pid: int) -> dict:
    """Every process below ``pid`` (a local Ray's GCS, raylet, agents and workers),
    with its command line (Ray titles a worker ``ray::TrainerWorker`` and so on)."""
    import psutil

    out = {}
    for p in psutil.Process(pid).children(recursive=True):
        try:
            out[p] = " ".join(p.cmdline()).strip()
        except psutil.Error:  # exited meanwhile
            pass
    return out


def alive(procs: dict, grace_s: float = 10.0) -> list[str]:
    """Command lines of ``procs`` still running after up to ``grace_s`` seconds."""
    import psutil

    deadline = time.monotonic() + grace_s
    while True:
        left = []
        for p, cmdline in procs.items():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(cmdline[:120])
            except psutil.NoSuchProcess:
                pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def actor_pids(pid: int, cls: str) -> list[int]:
    """The processes below ``pid`` that run an actor of class ``cls`` (e.g. TrainerWorker)."""
    return [p.pid for p, cmdline in descendants(pid).items() if f"ray::{cls}" in cmdline]


def trainer_rank_pids(pid: int) -> list[int]:
    """The trainer ranks below ``pid``, rank 0 first (one trainer group of two ranks).

    Rank 0 hosts the group's rendezvous store, on the port that
    ``TrainerWorker.address`` draws from 20000..31999; gloo's own sockets and
    Ray's worker ports lie outside that range.
    """
    import psutil

    ranks = actor_pids(pid, "TrainerWorker")
    assert len(ranks) == 2, ranks

    def hosts_store(p: int) -> bool:
        conns = psutil.Process(p).net_connections(kind="tcp")
        return any(c.status == psutil.CONN_LISTEN and 20000 <= c.laddr.port < 32000 for c in conns)

    first = [p for p in ranks if hosts_store(p)]
    assert len(first) == 1, f"cannot tell rank 0 among {ranks}"
    return [first[0], next(p for p in ranks if p != first[0])]
