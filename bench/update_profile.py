"""Where one policy update's time goes on a GPU: the FSDP2 engine's update at
``bench/gpu_check.py``'s short shape under ``torch.profiler``, beside the plain
torch + transformers loop (``bench/plain_update.py``) on the same model and batch.

    python bench/update_profile.py [--shape short|long] [--compile] [--no-plain] [--out DIR]

Prints, for each: the wall time of one update, the GPU's busy time (the sum of its
kernels' times; their gap to the wall time is time the GPU waited on the host),
the kernel launches, the host's busiest operators and the GPU's, and the time in
FSDP2's hooks. Writes ``update_profile_<shape>.txt`` (and a Chrome trace of each)
to ``--out``. ``--compile``: the engine with ``trainer.compile`` (its decoder layers
and log-prob kernels compiled during the warm-up updates; files named
``update_profile_<shape>_compiled``); ``--no-plain``: the engine alone.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def summarize(prof, wall: float, name: str) -> str:
    events = prof.key_averages()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.device_time for e in kernels) / 1e6
    fsdp = sum(e.cpu_time_total for e in events if e.key.startswith("FSDP::")) / 1e6
    lines = [
        f"## {name}",
        f"wall {wall:.3f} s; GPU busy {busy:.3f} s ({busy / wall:.0%}); "
        f"{len(kernels)} kernels; FSDP hooks {fsdp:.3f} s of host time (nested)",
        "",
        "GPU time by operator:",
        events.table(sort_by="self_device_time_total", row_limit=22, max_name_column_width=60),
        "host time by operator:",
        events.table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=60),
    ]
    return "\n".join(lines)


def main() -> None:
    import gpu_check
    import plain_update
    from torch.profiler import ProfilerActivity, profile

    from rlpost.algos import PolicyLossConfig
    from rlpost.trainers.fsdp.engine import FSDPEngine, FSDPEngineConfig

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="short", choices=list(gpu_check.UPDATE_SHAPES))
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--compile", action="store_true", help="trainer.compile's engine")
    p.add_argument("--no-plain", action="store_true", help="leave the plain loop out")
    a = p.parse_args()
    name = a.shape + ("_compiled" if a.compile else "")
    samples, prompt, response, micro = gpu_check.UPDATE_SHAPES[a.shape]
    a.out.mkdir(parents=True, exist_ok=True)
    report = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = gpu_check.random_model_dir("0.5B", Path(tmp) / "m")
        cfg = FSDPEngineConfig(
            model_path=str(model_dir), dtype="float32", mixed_precision="bf16", lr=1e-6,
            lr_warmup_steps=0, micro_batch_size=micro, device="cuda", backend="nccl",
            compile=a.compile,
        )  # fmt: skip
        engine = FSDPEngine(cfg, 0, 1, f"file://{tmp}/rendezvous")
        batch = gpu_check.update_batch(samples, prompt, response, 151_936)
        batch.old_logp_bt = engine.logprobs(batch)
        for _ in range(2):
            engine.update_policy(batch, PolicyLossConfig())
        torch.cuda.synchronize()
        acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        with profile(activities=acts) as prof:
            start = time.perf_counter()
            engine.update_policy(batch, PolicyLossConfig())
            torch.cuda.synchronize()
            wall = time.perf_counter() - start
        prof.export_chrome_trace(str(a.out / f"update_profile_{name}_rlpost.json"))
        what = ", trainer.compile" if a.compile else ""
        report.append(summarize(prof, wall, f"rlpost update, {a.shape} shape{what}"))
        engine.close()
        del engine
        torch.cuda.empty_cache()

        if not a.no_plain:  # its own timing loop, profiled around one more step
            with profile(activities=acts) as prof:
                start = time.perf_counter()
                row = plain_update.run(str(model_dir), "cuda", samples, prompt, response, micro, 1)
                torch.cuda.synchronize()
            wall = time.perf_counter() - start
            what = "plain loop: load, warm-up step, one step"
            report.append(f"plain loop row: {row}\n" + summarize(prof, wall, what))
    text = "\n\n".join(report)
    (a.out / f"update_profile_{name}.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
