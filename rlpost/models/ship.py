"""Build a pre-warmed base that rlpost ships (``rlpost/models/bases``).

``python -m rlpost.models.ship [overrides...]`` warms the built-in model up on this
machine for the settings the overrides give (``agent=calculator``: the calc task's
base) and stores it under their cache key, with the overrides and the CPU kernels it
was built with in its ``warmup.json``. ``tests/unit/test_shipped_bases.py`` fails when
a change to the warm-up's settings or cache key leaves a shipped base stale.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# What picks the CPU kernels the warm-up runs on, and so its rounding (the arith base
# was built with ATen, MKL and oneDNN held to AVX2; each base's warmup.json says how).
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA")


def main(argv: list[str] | None = None) -> int:
    import torch

    from rlpost.config.compose import compose
    from rlpost.models.warmup import SHIPPED_DIR, WARMUP_RECORD, warmup_key

    overrides = list(sys.argv[1:] if argv is None else argv)
    key = warmup_key(compose(overrides))
    local = [*overrides, "model.warmup.shipped=false"]
    dest = SHIPPED_DIR / key
    with tempfile.TemporaryDirectory() as tmp:
        cache, run_dir = Path(tmp) / "cache", Path(tmp) / "run"
        cmd = [
            sys.executable, "-m", "rlpost.main", *local, "trainer.total_steps=0",
            f"model.cache_dir={cache}", f"trainer.run_dir={run_dir}",
        ]  # fmt: skip
        subprocess.run(cmd, check=True)
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(cache / warmup_key(compose(local)), dest)
    record = json.loads((dest / WARMUP_RECORD).read_text())
    kernels = {k: os.environ[k] for k in KERNEL_ENV if k in os.environ}
    record |= {
        "overrides": overrides,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "kernel_env": kernels,
    }
    (dest / WARMUP_RECORD).write_text(json.dumps(record, indent=1) + "\n")
    print(f"shipped base {dest}: {record}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
