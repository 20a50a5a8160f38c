"""The GPU acceptance check (bench/gpu_check.sh, bench/gpu_check.py) runs: its
measurements' code at tiny shapes on the CPU in CI, the whole check (the CUDA-IPC
hand-off and the tests too) where a GPU is present."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_check(tmp_path: Path, device: str) -> list[dict]:
    """``bench/gpu_check.sh`` as a user runs it, its results under ``$OUT``."""
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    args = ["--device", "cpu", "--small"] if device == "cpu" else ["--small"]
    proc = subprocess.run(
        ["bash", "bench/gpu_check.sh", *args], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    # the summary table is printed last
    assert proc.stdout.rstrip().splitlines()[-1].startswith("| ")
    assert "| update | rlpost (FSDP2, bf16) |" in (tmp_path / "gpu_check.md").read_text()
    return json.loads((tmp_path / "gpu_check.json").read_text())


def test_the_check_runs_on_the_cpu_at_tiny_shapes(tmp_path):
    rows = run_check(tmp_path, "cpu")
    updates = {r["name"]: r for r in rows if r["check"] == "update"}
    assert set(updates) == {"short", "long"}
    # 4 x (8 + 8) and 4 x (8 + 24) tokens, no padding
    assert updates["short"]["tokens"] == 64 and updates["long"]["tokens"] == 128
    for r in updates.values():
        assert r["tokens_per_s"] > 0 and r["params"] > 0 and r["mfu"] is None  # no CPU peak
        assert r["fused_head"]  # the output layer folded into the log-probs
    plain = {r["name"]: r for r in rows if r["check"] == "plain_update"}
    assert set(plain) == {"short", "long"} and not any(r["oom"] for r in plain.values())
    assert plain["short"]["params"] == updates["short"]["params"]  # the same model
    assert sorted(r["impl"] for r in rows if r["check"] == "logprob_memory") == [
        "chunked",
        "fused",
        "materialised",
    ]
    # the hand-off's code with shared-memory files for CUDA-IPC handles: every byte
    # arrives, one bucket held at a time
    [ipc] = [r for r in rows if r["check"] == "ipc"]
    assert ipc["exact"] and ipc["buckets"] >= 1
    assert 0 < ipc["peak_bucket_mb"] <= max(ipc["bucket_mb"], ipc["bytes"] / 2**20)


def test_junit_counts_name_the_failures(tmp_path):
    sys.path.insert(0, str(REPO / "bench"))
    from gpu_check import test_counts

    (tmp_path / "a.xml").write_text(
        '<testsuites><testsuite tests="3" failures="1" errors="0" skipped="1">'
        '<testcase classname="t" name="ok"/><testcase classname="t" name="bad">'
        '<failure message="x"/></testcase><testcase classname="t" name="s"><skipped/>'
        "</testcase></testsuite></testsuites>"
    )
    (tmp_path / "b.xml").write_text('<testsuite tests="2" failures="0" errors="1" skipped="0">'
                                     '<testcase classname="u" name="e"><error/></testcase>'
                                     '<testcase classname="u" name="ok"/></testsuite>')  # fmt: skip
    got = test_counts([tmp_path / "a.xml", tmp_path / "b.xml"])
    # 5 tests: 1 failure, 1 error, 1 skipped -> 2 passed, 2 failed
    assert (got["passed"], got["failed"], got["skipped"]) == (2, 2, 1)
    assert got["failed_names"] == ["t::bad", "u::e"]


@pytest.mark.gpu
def test_the_whole_check_runs_on_a_gpu(tmp_path):
    rows = run_check(tmp_path, "cuda")
    ipc = [r for r in rows if r["check"] == "ipc"]
    assert ipc and all(r["exact"] and r["gb_per_s"] > 0 for r in ipc)
    lp = {r["impl"]: r["peak_extra_gib"] for r in rows if r["check"] == "logprob_memory"}
    assert lp["fused"] < lp["chunked"] < lp["materialised"]
