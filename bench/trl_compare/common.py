"""What every part of the comparison shares: paths, the batch and setup, the
process-tree monitor, the environments the runs start in."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent
REPO = BENCH.parent
SRC = REPO  # the rlpost checkout under test (--rlpost-src); set by compare_trl.main
ENTRY = BENCH / "compare_trl.py"  # the workers re-run it with --trl-worker / --raw-worker
TRL_VENV = BENCH / ".venv-trl"
TRL_VLLM_VENV = BENCH / ".venv-trl-vllm"
RUNS = BENCH / ".runs"
RESULTS = BENCH / "RESULTS.md"
RESULTS_JSON = BENCH / "results" / "compare_trl.json"
SEED = 0  # also rlpost's train/held-out split: every run uses it


@dataclass(frozen=True)
class Batch:
    prompts: int
    n: int

    @property
    def name(self) -> str:
        return f"{self.prompts}x{self.n}"

    @property
    def samples(self) -> int:
        return self.prompts * self.n


@dataclass(frozen=True)
class Setup:
    steps: int
    repeats: int
    max_tokens: int
    temperature: float
    lr: float
    micro_batch: int
    # The realistic workload's additions; the defaults are the old workload's.
    min_tokens: int = 0  # no end token before this many (every side alike)
    kv_cache_gib: float = 0.25  # vLLM's KV cache (rlpost's replica and the raw limit)
    model: str = "tiny"  # rlpost's built-in preset both frameworks start from
    # Seconds between memory samples of a run's process tree. Reading every
    # process's smaps_rollup costs the kernel a walk of its mappings: at 0.2 s it
    # took ~20 % of a core next to a vLLM replica, CPU the runs share.
    mem_every_s: float = 0.2  # 0: no memory sampling (a timing-only run)
    # "bf16": bf16 compute with fp32 master weights on every side (rlpost
    # trainer.mixed_precision=bf16, TRL bf16=True, the limit under autocast).
    precision: str = "float32"


# -- process-tree sampling ------------------------------------------------------------


def _pss_kib(pid: int) -> int | None:
    """Proportional set size of ``pid`` in KiB (None if unreadable or gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class TreeMonitor(threading.Thread):
    """Samples the memory of a process and all its descendants; optionally
    timestamps each line appended to a file (rlpost's metrics.jsonl)."""

    def __init__(self, pid: int, watch: Path | None = None, mem_every_s: float = 0.2):
        super().__init__(daemon=True)
        import psutil

        self.root = psutil.Process(pid)
        self.watch, self.mem_every_s = watch, mem_every_s
        self.peak_pss = self.peak_rss = 0  # bytes
        self.peak_procs: list[str] = []
        self.line_times: list[float] = []
        self._halt = threading.Event()

    def run(self) -> None:
        import psutil

        next_mem = 0.0 if self.mem_every_s > 0 else float("inf")
        while not self._halt.is_set():
            now = time.perf_counter()
            self._poll_file(now)
            if now >= next_mem:
                next_mem = now + self.mem_every_s
                try:
                    procs = {q.pid: q for q in [self.root, *self.root.children(recursive=True)]}
                except psutil.NoSuchProcess:
                    continue
                pss = rss = 0
                names = []
                for p in procs.values():
                    try:
                        r = p.memory_info().rss
                        names.append(p.name())
                    except psutil.Error:
                        continue
                    rss += r
                    pss += (_pss_kib(p.pid) or r // 1024) * 1024
                if pss > self.peak_pss:
                    self.peak_pss, self.peak_procs = pss, names
                self.peak_rss = max(self.peak_rss, rss)
            self._halt.wait(0.02)

    def _poll_file(self, now: float) -> None:
        if self.watch is None or not self.watch.exists():
            return
        lines = self.watch.read_bytes().count(b"\n")
        self.line_times += [now] * (lines - len(self.line_times))

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self._poll_file(time.perf_counter())


def run_monitored(
    cmd: list[str],
    log: Path,
    env: dict[str, str],
    cwd: Path,
    timeout: float,
    watch: Path | None,
    mem_every_s: float = 0.2,
) -> tuple[int, TreeMonitor, float]:
    """Run ``cmd`` with its output in ``log``; returns (exit code, monitor, seconds)."""
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        mon = TreeMonitor(proc.pid, watch, mem_every_s)
        mon.start()
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        mon.stop()
    return rc, mon, time.perf_counter() - start


def tail(path: Path, lines: int = 3) -> str:
    text = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return " | ".join(text[-lines:])[-400:]


# -- TRL's virtual environment --------------------------------------------------------------


def trl_python() -> Path:
    """bench/.venv-trl's python, creating the venv on first use."""
    py = TRL_VENV / "bin" / "python"
    check = [str(py), "-c", "import trl, transformers; from trl import GRPOTrainer"]
    if py.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return py
    print(f"creating {TRL_VENV} (torch 2.13.0 CPU + trl) ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(TRL_VENV)], check=True)
    (TRL_VENV / ".gitignore").write_text("*\n")
    pip = [str(py), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0", "trl"], check=True)
    # As for vLLM (DESIGN.md): these builds do not match torch 2.13.0+cpu and
    # break transformers' model imports; transformers does not need them.
    extras = ["torchvision", "torchaudio", "torchcodec"]
    subprocess.run([str(py), "-m", "pip", "uninstall", "-y", "-q", *extras], check=False)
    subprocess.run(check, check=True)
    return py


def trl_vllm_python() -> Path:
    """bench/.venv-trl-vllm's python, creating the venv on first use.

    TRL's vLLM integration needs vLLM in TRL's process, and vLLM's CPU build
    pins torch 2.13.0+cpu and transformers < 5.20. Rather than a second vLLM
    install, this venv sees rlpost's own packages (a ``.pth`` file naming
    rlpost's site-packages, after its own) and adds only what TRL needs on top:
    TRL then runs with the same torch, transformers and vLLM as rlpost.
    """
    py = TRL_VLLM_VENV / "bin" / "python"
    check = [str(py), "-c", "import trl, vllm; from trl import GRPOTrainer"]
    if py.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return py
    print(f"creating {TRL_VLLM_VENV} (rlpost's packages + trl) ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(TRL_VLLM_VENV)], check=True)
    (TRL_VLLM_VENV / ".gitignore").write_text("*\n")
    site = "import site; print(site.getsitepackages()[0])"
    own = subprocess.run([sys.executable, "-c", site], capture_output=True, text=True, check=True)
    new = subprocess.run([str(py), "-c", site], capture_output=True, text=True, check=True)
    (Path(new.stdout.strip()) / "rlpost_env.pth").write_text(own.stdout.strip() + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "-q", "trl"], check=True)
    subprocess.run(check, check=True)
    return py


def rlpost_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("RAY_ADDRESS", None)  # always a fresh local Ray, not a shared cluster
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def describe_source() -> str:
    """The benchmarked rlpost: commit, and whether its working tree had changes."""
    git = ["git", "-C", str(SRC)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return f"{SRC} (not a git checkout)"
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    return f"commit {head.stdout.strip()}" + (" + uncommitted changes" if dirty else "")


def psutil_total_gib() -> float:
    import psutil

    return psutil.virtual_memory().total / 2**30


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
