"""examples/agents/openenv_number_guess.py served by OpenEnv's own app, in a process of
its own on a free port, for the tests that train or play against it."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SERVER = Path(__file__).resolve().parents[1] / "examples" / "agents" / "openenv_number_guess.py"


@contextmanager
def number_guess_server(max_sessions: int) -> Iterator[tuple[str, subprocess.Popen]]:
    """The server's URL and process, once its ``/health`` answers; stopped on exit."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [sys.executable, str(SERVER), "--port", str(port), "--max-sessions", str(max_sessions)]
    proc = subprocess.Popen(args)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the OpenEnv example server did not start on {url}"
                    ) from None
                time.sleep(0.1)
        yield url, proc
    finally:
        proc.kill()
        proc.wait(timeout=30)
