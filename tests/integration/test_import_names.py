"""rlpost puts nothing but ``rlpost`` into a user's import space: a working
directory holding its own ``rollout.py``, ``trainers.py``, ``runtime.py`` and ``algos.py``
(common names for a user's scripts) runs the CLI as any other."""

from __future__ import annotations

import subprocess
import sys


def test_the_cli_runs_beside_a_users_rollout_trainers_and_algos_modules(tmp_path):
    for name in ("rollout", "trainers", "runtime", "algos"):
        (tmp_path / f"{name}.py").write_text(
            f"raise ImportError('the user {name}.py was imported')\n"
        )
    # The plan imports every layer (algos' configs, the rollout's sampling, the
    # trainers' settings) before it reports the missing reward file.
    proc = subprocess.run(
        [sys.executable, "-m", "rlpost.main", "reward.fn=missing.py:score"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "reward 'missing.py:score': file 'missing.py' does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr
    probe = (
        "import importlib.util, rlpost.rollout.agent, rlpost.trainers.fsdp, rlpost.algos;"
        "import rollout; print(rollout.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 1 and "the user rollout.py was imported" in out.stderr
    # the same probe from elsewhere: no top-level 'rollout' is installed at all
    empty = tmp_path / "empty"
    empty.mkdir()
    out = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u; print(u.find_spec('rollout'), "
         "u.find_spec('trainers'), u.find_spec('runtime'), u.find_spec('algos'))"],
        cwd=empty, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.stdout.strip() == "None None None None", out.stdout + out.stderr
