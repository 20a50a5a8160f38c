"""A torchvision that does not load beside torch (the registry's CUDA build beside
torch's CPU build, which ``pip install 'rlpost[cpu]'`` brings through vLLM) is a
config error naming the fix, before Ray starts and before a run directory exists."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ERROR = "operator torchvision::nms does not exist"


def fake_torchvision(root: Path) -> Path:
    """An installed torchvision 0.28.0 whose import fails as the CUDA build's does."""
    pkg = root / "torchvision"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"raise RuntimeError({ERROR!r})\n")
    meta = root / "torchvision-0.28.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: torchvision\nVersion: 0.28.0\n")
    return root


def test_a_broken_torchvision_is_named_with_the_command_that_removes_it(tmp_path, monkeypatch):
    from rlpost.plan.packages import broken_companions, check_companions

    if "torchvision" in sys.modules:
        pytest.skip("a working torchvision is already imported here")
    monkeypatch.syspath_prepend(str(fake_torchvision(tmp_path)))
    monkeypatch.delitem(sys.modules, "torchvision", raising=False)
    assert broken_companions() == {"torchvision": f"RuntimeError: {ERROR}"}
    [problem] = check_companions()
    assert f"torchvision 0.28.0 (RuntimeError: {ERROR})" in problem
    assert "pip uninstall -y torchvision torchaudio torchcodec" in problem


def test_nothing_is_reported_where_the_packages_are_absent_or_load():
    from rlpost.plan.packages import check_companions

    assert check_companions() == []  # this environment: none of them installed


def test_the_cli_stops_before_ray_and_writes_no_run_directory(tmp_path):
    fake = fake_torchvision(tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), str(REPO)])}
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "rlpost.main", "trainer.total_steps=1", f"trainer.run_dir={run}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert ERROR in proc.stderr and "pip uninstall -y torchvision" in proc.stderr
    assert "ray" not in proc.stderr.lower()  # nothing started
    assert not run.exists()
