"""Device-specific calls live in one module (``rlpost.runtime.device``): a CUDA
call, a ``"cuda"`` device string or a backend name anywhere else in the packages
would be a path that an Ascend (or CPU) run silently skips or breaks on."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("rlpost", "algos", "rollout", "runtime", "trainers")
FORBIDDEN = re.compile(r"""\.cuda\(|torch\.cuda\.|["'](?:cuda|nccl|hccl)["']""")
ALLOWED = {
    # the one module that decides what each device means
    "runtime/device.py": "the device module",
    # megatron-core calls torch.cuda itself; this shim stands in for those calls on the CPU
    "trainers/megatron/cpu_shim.py": "replaces torch.cuda's calls for megatron on the CPU",
}
# the config's allowed values of trainer.device are what a user writes, not a device call
ALLOWED_LINES = {("rlpost/config/groups.py", 'device: Literal["auto", "cpu", "cuda", "npu"]')}


def offending_lines() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel in ALLOWED:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if FORBIDDEN.search(line) and not any(
                    rel == f and snippet in line for f, snippet in ALLOWED_LINES
                ):
                    found.append(f"{rel}:{number}: {line.strip()}")
    return found


def test_no_device_strings_outside_the_device_module():
    found = offending_lines()
    assert not found, "ask rlpost.runtime.device instead:\n" + "\n".join(found)


def test_the_check_finds_what_it_forbids(tmp_path):
    """The pattern is not vacuous: each forbidden form matches, the module's own
    constants do not."""
    for line in ("x = t.cuda()", "torch.cuda.synchronize()", 'backend = "nccl"', "d = 'cuda'"):
        assert FORBIDDEN.search(line), line
    for line in ("devices.set_device(devices.CUDA, 0)", "kind.backend", "# on CUDA"):
        assert not FORBIDDEN.search(line), line


def test_vllm_on_ascend_runs_eager_with_the_nz_layout_off():
    from rlpost.rollout.vllm.config import ASCEND_ENV, VLLMEngineConfig, engine_args

    npu = engine_args(
        VLLMEngineConfig(model_path="m", kv_cache_gib=1.0, device="npu", enforce_eager=False), 0
    )
    assert npu["enforce_eager"] is True and "kv_cache_memory_bytes" not in npu
    assert ASCEND_ENV == {"VLLM_ASCEND_ENABLE_NZ": "0"}


def test_compiling_on_the_cpu_needs_the_compiler_torch_looks_for(monkeypatch, tmp_path):
    """``trainer.compile`` on a machine without the C++ compiler torch's inductor
    builds CPU kernels with: the engine refuses at start, naming the compiler,
    instead of failing inside the first micro-batch's compile."""
    from rlpost.runtime import device as devices

    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    problem = devices.compile_problem("cpu")
    assert problem is not None and f"{tmp_path / 'no-such-c++'} was not found" in problem
    assert "apt install g++" in problem
    fake = tmp_path / "c++"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    assert devices.compile_problem("cpu") is None
