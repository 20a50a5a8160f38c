"""The prepared accelerator check (bench/gpu_check.py) runs: its update and
log-prob paths at tiny shapes on the CPU in CI, the whole check (the CUDA-IPC
hand-off too) where a GPU is present."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_check(tmp_path: Path, device: str) -> list[dict]:
    out = tmp_path / "gpu_check"
    proc = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--device", device, "--small", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| update |" in Path(f"{out}.md").read_text()
    return json.loads(Path(f"{out}.json").read_text())


def test_the_check_runs_on_the_cpu_at_tiny_shapes(tmp_path):
    rows = run_check(tmp_path, "cpu")
    update = next(r for r in rows if r["check"] == "update")
    assert update["tokens"] == 4 * 16 and update["tokens_per_s"] > 0
    assert update["params"] > 0 and update["mfu"] is None  # no peak known for a CPU
    assert sorted(r["impl"] for r in rows if r["check"] == "logprob_memory") == [
        "chunked",
        "materialised",
    ]
    # the hand-off's code with shared-memory files for CUDA-IPC handles: every byte
    # arrives, one bucket held at a time
    [ipc] = [r for r in rows if r["check"] == "ipc"]
    assert ipc["exact"] and ipc["buckets"] >= 1
    assert 0 < ipc["peak_bucket_mb"] <= max(ipc["bucket_mb"], ipc["bytes"] / 2**20)


@pytest.mark.gpu
def test_the_whole_check_runs_on_a_gpu(tmp_path):
    rows = run_check(tmp_path, "cuda")
    ipc = [r for r in rows if r["check"] == "ipc"]
    assert ipc and all(r["exact"] and r["gb_per_s"] > 0 for r in ipc)
    lp = {r["impl"]: r["peak_extra_gib"] for r in rows if r["check"] == "logprob_memory"}
    assert lp["chunked"] < lp["materialised"]
