"""Real Ray nodes on this machine for the cluster tests: ``ray start --block``.

Each node runs in its own process session with its own ``--temp-dir`` and its
own ports, so tests never touch another Ray on the machine (``ray stop`` would
stop them all); ``stop`` ends exactly the processes the node started.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ports import free_port

REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))


class RayNode:
    """One ``ray start --block`` process and everything it spawned."""

    def __init__(self, args: list[str], env: dict[str, str]):
        # Short: Ray's socket paths under it must stay within 107 bytes.
        self.temp_dir = Path(tempfile.mkdtemp(prefix="rlpost-ray-", dir="/tmp"))
        self.log_path = self.temp_dir / "node.log"
        self.log = open(self.log_path, "w")  # noqa: SIM115
        ports = [
            "--node-manager-port", "--object-manager-port", "--metrics-export-port",
            "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
            "--runtime-env-agent-port",
        ]  # fmt: skip
        cmd = [RAY, "start", "--block", "--disable-usage-stats", f"--temp-dir={self.temp_dir}"]
        cmd += [f"{p}={free_port()}" for p in ports]
        cmd += ["--object-store-memory=200000000", *args]
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def wait_started(self, timeout: float = 60) -> str:
        """The cluster's GCS address, once this node is up (``ray start`` writes it last)."""
        marker = self.temp_dir / "ray_current_cluster"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray start exited {self.proc.returncode}: {self.logs()}")
            if marker.exists() and marker.read_text().strip():
                return marker.read_text().strip()
            time.sleep(0.5)
        raise TimeoutError(f"ray node not up after {timeout} s: {self.logs()}")

    def logs(self) -> str:
        self.log.flush()
        return self.log_path.read_text()[-3000:]

    def actor_logs(self, class_name: str) -> list[Path]:
        """Worker log files on this node of actors of ``class_name``."""
        found = set()
        for path in self.temp_dir.glob("session_*/logs/worker-*.out"):  # session_latest links
            if f":actor_name:{class_name}" in path.read_text(errors="replace"):
                found.add(path.resolve())
        return sorted(found)

    def grep_logs(self, pattern: str, files: str = "gcs_server.out") -> str:
        """Lines of this node's Ray logs ``files`` containing ``pattern``: what a
        failed test shows of why Ray stopped an actor."""
        lines = []
        for path in self.temp_dir.glob(f"session_*/logs/{files}"):
            lines += [ln for ln in path.read_text(errors="replace").splitlines() if pattern in ln]
        return "\n".join(lines[-40:])

    def stop(self) -> None:
        # The node's processes share the session (and process group) that
        # `ray start` leads; SIGKILL skips Ray's 30 s drain.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        self.log.close()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def node_env() -> dict[str, str]:
    """The environment of the node processes: this checkout importable, no outer Ray."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["TQDM_DISABLE"] = "1"
    # `python` in a job's entrypoint is this environment's, as on a node started from it
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    # Whether Ray turns token authentication on depends on whether a token
    # file happens to exist on the machine; these short-lived test clusters go
    # without, so any client (token or not) can talk to them.
    env["RAY_AUTH_MODE"] = "disabled"
    return env


@contextmanager
def ray_head(
    num_cpus: int,
    resources: dict | None = None,
    dashboard_port: int | None = None,
    home: Path | None = None,
) -> Iterator[tuple[RayNode, str]]:
    """A head node; yields it and the GCS address. Stopped even when the test fails.

    With ``home`` it starts as ``ray start --head`` does for a user: Ray's token
    authentication on, the token written to ``home/.ray/auth_token``."""
    args = ["--head", f"--port={free_port()}", f"--num-cpus={num_cpus}"]
    args += [f"--ray-client-server-port={free_port()}"]
    if resources:
        args.append(f"--resources={json.dumps(resources)}")
    if dashboard_port:
        args += ["--include-dashboard=true", "--dashboard-host=127.0.0.1"]
        args += [f"--dashboard-port={dashboard_port}"]
    else:
        args.append("--include-dashboard=false")
    env = node_env()
    if home is not None:
        env.pop("RAY_AUTH_MODE")
        env["HOME"] = str(home)
    node = RayNode(args, env)
    try:
        yield node, node.wait_started()
    finally:
        node.stop()


@contextmanager
def ray_worker_node(
    address: str, num_cpus: int, resources: dict | None = None
) -> Iterator[RayNode]:
    """A second node joining ``address``."""
    args = [f"--address={address}", f"--num-cpus={num_cpus}"]
    if resources:
        args.append(f"--resources={json.dumps(resources)}")
    node = RayNode(args, node_env())
    try:
        node.wait_started()
        yield node
    finally:
        node.stop()
