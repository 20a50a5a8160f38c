"""The `npu` extra's pins resolve together (no CANN, no NPU needed): pip resolves
the pinned wheels' metadata without installing them, torch-npu's own torch
requirement must be the torch pin, and the packages built from source on an
Ascend machine (vLLM with VLLM_TARGET_DEVICE=empty, vllm-ascend) must exist on
the index at their pinned versions. Prints what it checked; exits 1 on a mismatch."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]
# Built from source on the Ascend machine (docs/hardware.md): checked for existence.
SOURCE_BUILT = {"vllm": "0.23.0"}


def pins() -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    out = {}
    for req in project["optional-dependencies"]["npu"]:
        name, _, version = req.partition("==")
        if not version:
            sys.exit(f"npu extra: {req!r} is not pinned with ==")
        out[name.strip()] = version.strip()
    return out


def resolve(reqs: list[str]) -> dict[str, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps",
               "--ignore-installed", "--quiet", "--report", str(report), *reqs]  # fmt: skip
        subprocess.run(cmd, check=True)
        return {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]
                for i in json.loads(report.read_text())["install"]}  # fmt: skip


def index_has(name: str, version: str) -> bool:
    out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", name],
                         capture_output=True, text=True)  # fmt: skip
    listed = re.search(r"Available versions: (.*)", out.stdout)
    return bool(listed) and version in [v.strip() for v in listed.group(1).split(",")]


def main() -> int:
    wanted = pins()
    problems = []
    wheels = {n: v for n, v in wanted.items() if n != "vllm-ascend"}  # vllm-ascend: sdist only
    meta = resolve([f"{n}=={v}" for n, v in wheels.items()])
    for name, version in wheels.items():
        got = meta.get(name, {}).get("version")
        print(f"{name}=={version}: resolves to {got}")
        if got != version:
            problems.append(f"{name}: pinned {version}, pip resolves {got}")
    torch_pin = wanted["torch"]
    needs = [d for d in meta["torch-npu"].get("requires_dist", []) if d.startswith("torch ")]
    print(f"torch-npu requires {needs}")
    if not any(re.search(rf"==\s*{re.escape(torch_pin)}(\+cpu)?(\.\*)?$", d) for d in needs):
        problems.append(f"torch-npu=={wanted['torch-npu']} requires {needs}, not torch {torch_pin}")
    for name, version in {"vllm-ascend": wanted["vllm-ascend"], **SOURCE_BUILT}.items():
        found = index_has(name, version)
        print(f"{name}=={version}: {'on the index' if found else 'MISSING'}")
        if not found:
            problems.append(f"{name}=={version} is not on the package index")
    for p in problems:
        print("error:", p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
