"""The output layer's log-probs with the eager chunk kernels and with the compiled
ones (``trainer.compile``), side by side: time and peak memory of the forward and
backward of a policy loss, on the engine's path (``hidden_token_stats``: the last
hidden states and the output layer's weight, a chunk of tokens at a time, the
response tokens only).

    python bench/logprob_kernels.py                       # CPU, float32, 0.5B's vocabulary
    python bench/logprob_kernels.py --device cuda --dtype bfloat16 --samples 16 --tokens 2048

Legend: b = samples, t = tokens, v = vocab, d = hidden.

The loss is a GRPO-shaped ``-sum(A * logp * mask) / N`` with the entropy as a metric
(``algo.entropy_coef=0``, the default) and, in a second row, as a bonus in the loss
(gradient through it). A quarter of each sample is prompt (no loss). The compiled
kernels compile on their first call: that run is reported apart and not timed.
Peak memory is the device's on an accelerator and the process's resident memory
(``VmHWM``, reset before each run) on the CPU, above what was held before the run.
Writes ``bench/results/logprob_kernels.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from logprob_memory import _reset_peak, _status_kib

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "bench" / "results" / "logprob_kernels.md"
ENTROPY_COEF = 0.01


class Peak:
    """Peak memory above the start of a run: the device's allocator on an
    accelerator, the process's resident set on the CPU."""

    def __init__(self, device: str):
        from rlpost.runtime import device as devices

        self.device, self.devices = device, devices

    def start(self) -> None:
        if self.device == "cpu":
            _reset_peak()  # VmHWM back to VmRSS
            self.base = _status_kib("VmRSS") * 1024
        else:
            self.devices.synchronize(self.device)
            self.devices.reset_peak_memory(self.device)
            self.base = self.devices.peak_memory_bytes(self.device) or 0

    def gib(self) -> float:
        if self.device == "cpu":
            return (_status_kib("VmHWM") * 1024 - self.base) / 2**30
        return ((self.devices.peak_memory_bytes(self.device) or 0) - self.base) / 2**30


def run(args: argparse.Namespace, compiled: bool, bonus: bool) -> dict:
    from rlpost.runtime import device as devices
    from rlpost.trainers.logprobs import hidden_token_stats

    b, t, v, d = args.samples, args.tokens, args.vocab, args.hidden
    dtype = getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)
    h_btd = torch.randn(b, t, d, generator=g).to(args.device, dtype).requires_grad_()
    w_vd = (torch.randn(v, d, generator=g) * d**-0.5).to(args.device, dtype).requires_grad_()
    ids_bt = torch.randint(0, v, (b, t), generator=g).to(args.device)
    mask_bt = torch.ones(b, t, dtype=torch.bool)
    mask_bt[:, : t // 4] = False  # the prompt
    adv_bt = torch.randn(b, 1, generator=g).to(args.device)
    mask = mask_bt.to(args.device)
    n = float(mask_bt.sum())
    peak = Peak(args.device)

    def step() -> float:
        h_btd.grad = w_vd.grad = None
        logp_bt, entropy_bt = hidden_token_stats(
            h_btd, w_vd, ids_bt, 1.0, True, needed_bt=mask_bt, compiled=compiled
        )
        loss = -(adv_bt * logp_bt * mask).sum() / n
        if bonus:
            loss = loss - ENTROPY_COEF * (entropy_bt * mask).sum() / n
        loss.backward()
        return loss.item()

    start = time.perf_counter()
    loss = step()  # compiles, when compiled; allocator and kernel choices either way
    devices.synchronize(args.device)
    first_s = time.perf_counter() - start
    times, peaks = [], []
    for _ in range(args.repeats):
        peak.start()
        start = time.perf_counter()
        step()
        devices.synchronize(args.device)
        times.append(time.perf_counter() - start)
        peaks.append(peak.gib())
    assert h_btd.grad is not None and w_vd.grad is not None
    return {
        "kernels": "compiled" if compiled else "eager", "entropy": "bonus" if bonus else "metric",
        "median_s": statistics.median(times), "times_s": times, "first_s": first_s,
        "peak_gib": max(peaks), "loss": loss, "grad_h_norm": float(h_btd.grad.float().norm()),
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--tokens", type=int, default=512, help="tokens per sample")
    p.add_argument("--vocab", type=int, default=151_936)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(os.cpu_count() or 1)
    rows = []
    for bonus in (False, True):
        for compiled in (False, True):
            rows.append(run(args, compiled, bonus))
            r = rows[-1]
            print(
                f"{r['kernels']:8s} entropy {r['entropy']:6s} {r['median_s']:.3f} s "
                f"(first {r['first_s']:.1f} s), peak {r['peak_gib']:.2f} GiB",
                flush=True,
            )
    device = args.device
    if device != "cpu":
        device += f" ({torch.cuda.get_device_name()})" if device == "cuda" else ""
    b, t, v, d = args.samples, args.tokens, args.vocab, args.hidden
    cmd = " ".join(["python", "bench/logprob_kernels.py", *sys.argv[1:]])
    lines = [
        "# Log-prob chunk kernels: eager and compiled",
        "",
        f"`{cmd}`, {time.strftime('%Y-%m-%d')}, on {device}, {platform.machine()}, "
        f"{os.cpu_count()} CPU cores, torch {torch.__version__}.",
        "",
        f"{b} x {t} tokens (a quarter prompt), vocabulary {v:,}, hidden {d}, {args.dtype}; "
        f"`hidden_token_stats` forward + backward of a policy loss, median of {args.repeats} "
        "after a first run (which compiles the compiled kernels).",
        "",
        "| kernels | entropy | forward + backward s | first run s | peak GiB | loss |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        what = {"metric": "metric (coef 0)", "bonus": f"bonus (coef {ENTROPY_COEF})"}
        lines.append(
            f"| {r['kernels']} | {what[r['entropy']]} | {r['median_s']:.3f} | "
            f"{r['first_s']:.1f} | {r['peak_gib']:.2f} | {r['loss']:.6f} |"
        )
    lines.append("")
    for i in (0, 2):
        eager, fused = rows[i], rows[i + 1]
        lines.append(
            f"- entropy as a {eager['entropy']}: {eager['median_s'] / fused['median_s']:.2f}x "
            f"the eager kernels' speed, peak {eager['peak_gib']:.2f} -> {fused['peak_gib']:.2f} "
            f"GiB; losses {abs(eager['loss'] - fused['loss']):.1e} apart, gradient norms "
            f"{abs(eager['grad_h_norm'] - fused['grad_h_norm']):.1e} apart."
        )
    text = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    print()
    print(text)


if __name__ == "__main__":
    main()
