"""Peak memory of per-token log-probs + backward: materialised log-softmax vs chunked.

    python bench/logprob_memory.py                  # writes bench/results/logprob_memory.md
    python bench/logprob_memory.py --tokens 512     # 8 x 512 tokens (needs ~13 GB free)

Legend: b = samples, t = tokens, v = vocab, d = hidden.

What is measured is the trainer's work after the last hidden state: the
lm_head projection ``h_btd @ W_vd^T``, the log-probs of the sampled tokens
(and each position's entropy), a policy-gradient-shaped loss
``-sum(A * logp * mask) / N`` and its backward into ``h`` and ``W``, at a
150k vocabulary (Qwen2's is 151,936) in float32 on the CPU. Two ways:

- ``materialised``: what ``trainers/fsdp/engine.py`` did before, a float32
  copy of the logits divided by the temperature, ``log_softmax`` over the
  whole vocabulary and a ``gather``; the entropy from ``softmax`` and
  ``logsumexp`` of the same tensor.
- ``chunked``: ``rlpost.trainers.logprobs.token_logprobs_and_entropy``, a few tokens
  at a time, keeping two floats per token for the backward pass.

Two loss shapes: the entropy as a metric only (``algo.entropy_coef=0``, the
default: no gradient through it) and as a bonus in the loss (gradient through
it). Each variant runs in a fresh process; its peak resident memory above the
resident memory after setup (torch imported, ``h``, ``W`` and the batch
allocated) is read from ``/proc/self/status`` (``VmHWM``, reset through
``/proc/self/clear_refs`` after setup; ``ru_maxrss`` where that is not
possible).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "bench" / "results" / "logprob_memory.md"
VARIANTS = [
    ("materialised", "metric"),
    ("chunked", "metric"),
    ("materialised", "bonus"),
    ("chunked", "bonus"),
]
TEMPERATURE = 1.0
ENTROPY_COEF = 0.01


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux: ``echo 5 > /proc/self/clear_refs``)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return _status_kib("VmHWM") <= _status_kib("VmRSS") + 1024


def run_variant(impl: str, entropy: str, b: int, t: int, v: int, d: int) -> dict:
    """One forward + backward in this process; returns its memory and time."""
    import torch
    import torch.nn.functional as F

    from rlpost.algos import entropy_from_logits
    from rlpost.trainers.logprobs import token_logprobs_and_entropy

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    h_btd = torch.randn(b, t, d, generator=g).requires_grad_()
    w_vd = (torch.randn(v, d, generator=g) * d**-0.5).requires_grad_()
    ids_bt = torch.randint(0, v, (b, t), generator=g)
    adv_bt = torch.randn(b, 1, generator=g).expand(b, t)
    mask_bt = torch.ones(b, t)
    mask_bt[:, : t // 4] = 0  # a prompt: no loss on the first quarter
    n_tokens = float(mask_bt.sum())
    bonus = entropy == "bonus"

    def policy_loss() -> torch.Tensor:
        """The loss; its intermediates live on only where the graph keeps them, as in the
        trainer, where the backward pass runs after the loss function has returned."""
        logits_btv = h_btd @ w_vd.T
        if impl == "materialised":
            z_btv = logits_btv.float() / TEMPERATURE
            logp_btv = F.log_softmax(z_btv[:, :-1], dim=-1)
            logp_bt = F.pad(logp_btv.gather(-1, ids_bt[:, 1:, None])[..., 0], (1, 0))
            with torch.set_grad_enabled(bonus):
                entropy_bt = F.pad(entropy_from_logits(z_btv[:, :-1]), (1, 0))
        else:
            logp_bt, entropy_bt = token_logprobs_and_entropy(logits_btv, ids_bt, TEMPERATURE)
            if not bonus:
                entropy_bt = entropy_bt.detach()
        loss = -(adv_bt * logp_bt * mask_bt).sum() / n_tokens
        if bonus:
            loss = loss - ENTROPY_COEF * (entropy_bt * mask_bt).sum() / n_tokens
        return loss

    exact = _reset_peak()
    base_kib = _status_kib("VmRSS")
    start_maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    loss = policy_loss()
    loss.backward()
    seconds = time.perf_counter() - start
    if exact:
        peak_kib = _status_kib("VmHWM") - base_kib
    else:  # ru_maxrss is the lifetime peak: setup may have been higher than base
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_kib
        peak_kib = max(peak_kib, 0) if start_maxrss <= base_kib else peak_kib
    assert h_btd.grad is not None and w_vd.grad is not None
    return {
        "impl": impl,
        "entropy": entropy,
        "peak_gib": peak_kib / 2**20,
        "seconds": seconds,
        "loss": float(loss),
        "grad_h_norm": float(h_btd.grad.norm()),
        "peak_from": "VmHWM" if exact else "ru_maxrss",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--tokens", type=int, default=256, help="tokens per sample")
    p.add_argument("--vocab", type=int, default=150_000)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--variant", help=argparse.SUPPRESS)  # impl,entropy: run one, print JSON
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    shape = (args.samples, args.tokens, args.vocab, args.hidden)
    if args.variant:
        impl, entropy = args.variant.split(",")
        print(json.dumps(run_variant(impl, entropy, *shape)))
        return

    rows = []
    for impl, entropy in VARIANTS:
        cmd = [sys.executable, __file__, "--variant", f"{impl},{entropy}"]
        cmd += ["--samples", str(args.samples), "--tokens", str(args.tokens)]
        cmd += ["--vocab", str(args.vocab), "--hidden", str(args.hidden)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ})
        if proc.returncode != 0:
            raise SystemExit(f"{impl}, entropy {entropy}: failed\n{proc.stderr[-2000:]}")
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"{impl:12s} entropy {entropy:6s} peak {r['peak_gib']:.2f} GiB {r['seconds']:.2f} s")

    b, t, v, d = shape
    btv_gib = b * t * v * 4 / 2**30
    lines = [
        "# Peak memory of per-token log-probs + backward",
        "",
        f"Written by `bench/logprob_memory.py` on {platform.machine()}, "
        f"{os.cpu_count()} CPU cores, Python {platform.python_version()}, torch "
        f"{__import__('torch').__version__}; 1 torch thread.",
        "",
        "```bash",
        "python bench/logprob_memory.py" + (f" --tokens {t}" if t != 256 else ""),
        "```",
        "",
        f"{b} samples x {t} tokens, vocabulary {v:,}, hidden {d}, float32 on the CPU: "
        f"one [b, t, v] float32 tensor is {btv_gib:.2f} GiB. Peak: resident memory above "
        "the process's after setup (the logits, their gradient and every intermediate "
        "of the lm_head projection, the log-probs, the entropy and the backward), "
        "each variant in a fresh process. The logits and their gradient (2 x "
        f"{btv_gib:.2f} GiB) are there in both: only a fused lm_head + log-prob "
        "kernel avoids them.",
        "",
        "| log-probs | entropy | peak GiB | peak / [b, t, v] | forward + backward s | loss |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        what = {"metric": "metric (coef 0)", "bonus": f"bonus (coef {ENTROPY_COEF})"}
        lines.append(
            f"| {r['impl']} | {what[r['entropy']]} | {r['peak_gib']:.2f} | "
            f"{r['peak_gib'] / btv_gib:.1f}x | {r['seconds']:.2f} | {r['loss']:.6f} |"
        )
    by = {(r["impl"], r["entropy"]): r for r in rows}
    lines.append("")
    for entropy in ("metric", "bonus"):
        old, new = by[("materialised", entropy)], by[("chunked", entropy)]
        lines.append(
            f"- entropy as a {entropy}: {old['peak_gib']:.2f} -> {new['peak_gib']:.2f} GiB "
            f"({old['peak_gib'] / new['peak_gib']:.1f}x less); same loss "
            f"({abs(old['loss'] - new['loss']):.1e} apart) and gradient norm "
            f"({abs(old['grad_h_norm'] - new['grad_h_norm']):.1e} apart)."
        )
    sources = sorted({r["peak_from"] for r in rows})
    lines.append(f"- peak read from {', '.join(sources)}.")
    text = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print()
    print(text)


if __name__ == "__main__":
    main()
