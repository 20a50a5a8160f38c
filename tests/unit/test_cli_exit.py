"""``python -m rlpost.main`` ends without the interpreter's teardown once ``main``
has returned: with its exit code, its output flushed and the exit handlers run."""

from __future__ import annotations

import subprocess
import sys


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_exit_now_keeps_the_code_the_output_and_the_exit_handlers():
    out = run(
        "import atexit, sys\n"
        "from rlpost.main import exit_now\n"
        "atexit.register(lambda: print('handler ran'))\n"
        "print('buffered', end='')\n"
        "sys.stderr.write('to stderr')\n"
        "exit_now(3)\n"
    )
    assert out.returncode == 3
    assert out.stdout == "bufferedhandler ran\n"
    assert out.stderr == "to stderr"


def test_exit_now_waits_for_a_thread_that_is_not_a_daemon():
    # The interpreter would wait for it; so does exit_now (it exits the usual way).
    out = run(
        "import threading, time\n"
        "from rlpost.main import exit_now\n"
        "threading.Thread(target=lambda: (time.sleep(0.5), print('thread done'))).start()\n"
        "exit_now(0)\n"
    )
    assert out.returncode == 0
    assert out.stdout == "thread done\n"


def test_the_cli_exits_with_main_s_code():
    bad = subprocess.run(
        [sys.executable, "-m", "rlpost.main", "algo=no_such_algo"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.startswith("error: ")
