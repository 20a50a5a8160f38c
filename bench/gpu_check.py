"""The accelerator check: what rlpost's trainer engines do on one CUDA GPU, with
only torch, transformers and peft installed (no vLLM, no Ray), in a few minutes.

    bash bench/gpu_check.sh                         # on the GPU machine: the tests too
    python bench/gpu_check.py --device cpu --small  # the same code on the CPU, tiny shapes

Five measurements, each printed as it finishes and all written to
``bench/results/gpu_check.json`` (a list of rows) and ``gpu_check.md`` (from the CPU:
``bench/.runs/``, whose figures are not the GPU's):

1. ``update``: the FSDP2 engine's policy update (``update_policy``, forward and
   backward of every micro-batch, the optimizer step) on a random
   Qwen2-0.5B-shaped model (hidden 896, 24 layers, 14 query / 2 KV heads,
   MLP 4864, vocabulary 151,936), bf16 compute over fp32 master weights
   (``mixed_precision=bf16``, as ``trainer.mixed_precision=bf16``), at two shapes:
   32 x (128 + 384) tokens in micro-batches of 8, and 64 x (512 + 1536) in
   micro-batches of 16. Tokens/s counts the real (unpadded) tokens; MFU takes 6
   FLOPs per parameter per token (forward + backward, attention's own FLOPs left
   out) against the device's dense bf16 peak (``--peak-tflops``, or the table
   below by device name).
2. ``plain_update``: the same model and batch updated by plain torch +
   transformers (``bench/plain_update.py``) at the same micro-batch, or the largest
   that fits; the ratio of the two is the figure to beat.
3. ``logprob_memory``: peak device memory and time of per-token log-probs and
   their backward at a 150k vocabulary from the last hidden states: the logits
   materialised with ``log_softmax``, the engine's chunked
   ``token_logprobs_and_entropy`` over the logits, and ``hidden_token_stats``,
   which never holds them, with the eager chunk kernels and (not with ``--small``)
   the compiled ones of ``trainer.compile``.
4. ``ipc``: the CUDA-IPC weight hand-off between two processes on one device,
   the colocated path of ``rollout.weight_sync=ipc`` and its code: trainer rank 0's
   ``IpcSender`` packs the model's weights in buckets and hands out each bucket's
   IPC handle, the receiver maps it, copies the tensors into its own weights and
   asks for the next; GB/s at the 0.5B and 1.5B shapes. One bucket is held at a
   time.

5. ``update`` with ``compiled``: the first measurement again with every decoder
   layer and the log-prob chunk kernels compiled (``trainer.compile``), last and only while ``--budget-s`` lasts,
   since the compiling takes as long as it takes; its first update's time, compiling
   included, is in the row. Not with ``--small``.

With ``--tests JUNIT.xml`` (``bench/gpu_check.sh`` runs ``pytest -m gpu`` first)
the tests' counts join the table, which is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results"

# Dense bf16 peak TFLOPS by a substring of torch.cuda.get_device_name().
PEAK_TFLOPS = {"H200": 989.4, "H100": 989.4, "H800": 989.4, "A100": 312.0, "L40S": 362.1}
SHAPES = {
    # name: hidden, layers, heads, kv heads, MLP, vocabulary
    "0.5B": (896, 24, 14, 2, 4864, 151_936),
    "1.5B": (1536, 28, 12, 2, 8960, 151_936),
    "small": (64, 2, 4, 2, 128, 1024),
    # the 0.5B's vocabulary and output layer on two narrow layers: where the log-prob
    # path dominates, at a size a CPU updates in seconds
    "wide": (64, 2, 4, 2, 128, 151_936),
}
# The update's two shapes: samples, prompt tokens, response tokens, micro-batch
UPDATE_SHAPES = {"short": (32, 128, 384, 8), "long": (64, 512, 1536, 16)}
SMALL_UPDATE_SHAPES = {"short": (4, 8, 8, 2), "long": (4, 8, 24, 4)}
# The two shapes' prompt and response lengths with fewer samples, for a CPU
CPU_UPDATE_SHAPES = {"short": (8, 128, 384, 4), "long": (2, 512, 1536, 1)}


def qwen2_config(shape: str):  # type: ignore[no-untyped-def]
    from transformers import Qwen2Config

    hidden, layers, heads, kv, mlp, vocab = SHAPES[shape]
    return Qwen2Config(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv, intermediate_size=mlp, vocab_size=vocab,
        max_position_embeddings=4096, tie_word_embeddings=True, torch_dtype="float32",
    )  # fmt: skip


def random_model_dir(shape: str, out: Path) -> Path:
    """A Qwen2 directory with random weights (float32), built on the CPU."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    Qwen2ForCausalLM(qwen2_config(shape)).save_pretrained(out)
    return out


def sync(device: str) -> None:
    from rlpost.runtime import device as devices

    devices.synchronize(device)


# -- 1. the update --------------------------------------------------------------


def update_batch(samples: int, prompt: int, response: int, vocab: int):  # type: ignore[no-untyped-def]
    from rlpost.trainers.batch import TrajectoryBatch

    g = torch.Generator().manual_seed(0)
    total = prompt + response
    ids = torch.randint(5, vocab, (samples, total), generator=g)
    resp = torch.zeros(samples, total, dtype=torch.long)
    resp[:, prompt:] = 1
    b = TrajectoryBatch(
        input_ids_bt=ids,
        attention_mask_bt=torch.ones(samples, total, dtype=torch.long),
        response_mask_bt=resp,
    )
    b.advantages_bt = torch.randn(samples, 1, generator=g) * resp
    return b


def check_update(
    args: argparse.Namespace, model_dir: Path, name: str, compiled: bool = False
) -> dict:
    from rlpost.algos import PolicyLossConfig
    from rlpost.runtime import device as devices
    from rlpost.trainers.fsdp.engine import FSDPEngine, FSDPEngineConfig

    samples, prompt, response, micro_batch = args.update_shapes[name]
    cfg = FSDPEngineConfig(
        model_path=str(model_dir), dtype="float32", mixed_precision=args.mixed_precision, lr=1e-6,
        lr_warmup_steps=0, micro_batch_size=micro_batch, device=args.device,
        backend=devices.kind(args.device).backend, threads=os.cpu_count() or 1,
        compile=compiled,
    )  # fmt: skip
    engine = FSDPEngine(cfg, 0, 1, f"file://{tempfile.mkdtemp()}/rendezvous")
    batch = update_batch(samples, prompt, response, qwen2_config(args.shape).vocab_size)
    batch.old_logp_bt = engine.logprobs(batch)
    start = time.perf_counter()
    engine.update_policy(batch, PolicyLossConfig())  # warm-up: allocator, kernels, compiling
    sync(args.device)
    warmup_s = time.perf_counter() - start
    devices.reset_peak_memory(args.device)
    start = time.perf_counter()
    for _ in range(args.updates):
        engine.update_policy(batch, PolicyLossConfig())
    sync(args.device)
    seconds = (time.perf_counter() - start) / args.updates
    tokens = int(batch.attention_mask_bt.sum())
    params = engine.num_params
    tps = tokens / seconds
    row = {
        "check": "update", "name": name, "shape": args.shape, "params": params,
        "tokens": tokens, "micro_batch": micro_batch, "update_s": seconds, "tokens_per_s": tps,
        "tflops": 6 * params * tps / 1e12, "mfu": mfu(args, params, tps),
        "peak_mem_gib": (devices.peak_memory_bytes(args.device) or 0) / 2**30,
        "fused_head": engine._head is not None, "compiled": compiled, "warmup_s": warmup_s,
    }  # fmt: skip
    engine.close()
    del engine
    devices.empty_cache(args.device)
    return row


def mfu(args: argparse.Namespace, params: int, tokens_per_s: float) -> float | None:
    peak = args.peak_tflops or next(
        (v for k, v in PEAK_TFLOPS.items() if k in device_name(args.device)), None
    )
    return (6 * params * tokens_per_s / 1e12) / peak if peak else None


def check_plain_update(args: argparse.Namespace, model_dir: Path, name: str) -> list[dict]:
    """``bench/plain_update.py`` at the engine's micro-batch, halved until it fits."""
    sys.path.insert(0, str(ROOT / "bench"))
    import plain_update

    from rlpost.runtime import device as devices

    samples, prompt, response, micro_batch = args.update_shapes[name]
    rows = []
    while micro_batch >= 1:
        row = plain_update.run(
            str(model_dir), args.device, samples, prompt, response, micro_batch, args.updates
        )
        row.update(name=name, shape=args.shape)
        rows.append(row)
        devices.empty_cache(args.device)  # the plain loop's model and optimizer are gone
        if not row["oom"]:
            row["mfu"] = mfu(args, row["params"], row["tokens_per_s"])
            break
        micro_batch //= 2
    return rows


# -- 2. log-prob memory -----------------------------------------------------------


def check_logprob_memory(args: argparse.Namespace) -> list[dict]:
    import torch.nn.functional as F

    from rlpost.runtime import device as devices
    from rlpost.trainers.logprobs import hidden_token_stats, token_logprobs_and_entropy

    b, t, d = args.lp_samples, args.lp_tokens, 896
    v = 150_000 if args.shape != "small" else 4096
    rows = []
    impls = ["materialised", "chunked", "fused"] + ([] if args.small else ["fused, compiled"])
    for impl in impls:
        g = torch.Generator().manual_seed(0)
        h = torch.randn(b, t, d, generator=g).to(args.device, torch.bfloat16).requires_grad_()
        w = (torch.randn(v, d, generator=g) * d**-0.5).to(args.device, torch.bfloat16)
        w.requires_grad_()
        ids = torch.randint(0, v, (b, t), generator=g).to(args.device)
        times = []
        for _ in range(3):  # the first pays for the allocator and kernel choices
            h.grad = w.grad = None
            sync(args.device)
            devices.empty_cache(args.device)
            devices.reset_peak_memory(args.device)
            base = devices.peak_memory_bytes(args.device) or 0
            start = time.perf_counter()
            if impl.startswith("fused"):
                compiled = impl.endswith("compiled")  # the first run compiles
                logp, _ = hidden_token_stats(h, w, ids, 1.0, True, compiled=compiled)
            else:
                logits = h @ w.T
                if impl == "materialised":
                    lsm = F.log_softmax(logits.float()[:, :-1], -1)
                    logp = lsm.gather(-1, ids[:, 1:, None])[..., 0]
                else:
                    logp, _ = token_logprobs_and_entropy(logits, ids, 1.0)
                del logits
            (-logp.sum() / logp.numel()).backward()
            sync(args.device)
            times.append(time.perf_counter() - start)
            peak = devices.peak_memory_bytes(args.device)
            del logp
        rows.append({
            "check": "logprob_memory", "impl": impl, "samples": b, "tokens": t, "vocab": v,
            "peak_extra_gib": None if peak is None else (peak - base) / 2**30,
            "seconds": min(times[1:]),
        })  # fmt: skip
        del h, w, ids
    return rows


# -- 3. CUDA-IPC hand-off --------------------------------------------------------


def _receiver(conn, shapes: list, device: str) -> None:  # type: ignore[no-untyped-def]
    """The rollout side: its own weights, filled from each bucket it maps; it asks
    for the next bucket once its copies of the last are done (as
    ``rlpost.workers.ipc_source.IpcSource`` does in a replica)."""
    from rlpost.runtime.weight_wire import open_bucket, unpack

    own = {n: torch.empty(s, dtype=torch.bfloat16, device=device) for n, s in shapes}
    conn.send("next")
    while True:
        msg = conn.recv()
        if msg is None:
            break
        slots, handle = msg
        bucket = open_bucket(handle)
        for name, tensor in unpack(slots, bucket):
            own[name].copy_(tensor)
        if device != "cpu":
            torch.cuda.synchronize()
        del bucket
        conn.send("next")
    conn.send(sum(float(t.float().sum()) for t in own.values()))


class _Weights:
    """Trainer rank 0 as ``IpcSender`` reads it: the full weights, named."""

    rank = 0

    def __init__(self, weights: dict):
        self.weights = weights

    def named_weights(self) -> list:
        return list(self.weights.items())


def check_ipc(args: argparse.Namespace, shape: str) -> dict:
    import torch.multiprocessing as mp
    from transformers import Qwen2ForCausalLM

    from rlpost.runtime.weight_wire import IpcSender

    with torch.device("meta"):
        meta = Qwen2ForCausalLM(qwen2_config(shape))
    shapes = [(n, tuple(p.shape)) for n, p in meta.state_dict().items()]
    g = torch.Generator(device=args.device).manual_seed(0)
    weights = {
        n: torch.randn(s, generator=g, device=args.device, dtype=torch.bfloat16) for n, s in shapes
    }
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_receiver, args=(theirs, shapes, args.device))
    child.start()
    assert ours.recv() == "next"
    if args.device != "cpu":
        torch.cuda.synchronize()
    start = time.perf_counter()
    # the sync's own code: rollout.weight_sync=ipc packs and hands out buckets so
    sender = IpcSender(_Weights(weights), args.bucket_mb << 20, torch.device(args.device))
    plan = sender.plan
    for slots in plan.buckets:
        ours.send((slots, sender.next()))
        assert ours.recv() == "next"
    seconds = time.perf_counter() - start
    stats = sender.close()
    ours.send(None)
    their_sum = ours.recv()
    child.join(timeout=60)
    our_sum = sum(float(t.float().sum()) for t in weights.values())
    return {
        "check": "ipc", "shape": shape, "params": sum(t.numel() for t in weights.values()),
        "bytes": plan.total_bytes, "buckets": len(plan.buckets), "bucket_mb": args.bucket_mb,
        "peak_bucket_mb": stats["peak"] / 2**20,
        "seconds": seconds, "gb_per_s": plan.total_bytes / seconds / 1e9,
        "exact": abs(their_sum - our_sum) <= 1e-6 * max(1.0, abs(our_sum)),
    }  # fmt: skip


# -- the report -----------------------------------------------------------------


def device_name(device: str) -> str:
    if device == "cpu":
        return platform.processor() or platform.machine()
    return torch.cuda.get_device_name()


def test_counts(junits: list[Path]) -> dict:
    """``pytest -m gpu``'s counts from its JUnit XML files (``bench/gpu_check.sh`` writes them)."""
    import xml.etree.ElementTree as ET

    suites = []
    for junit in junits:
        root = ET.parse(junit).getroot()
        suites += [root] if root.tag == "testsuite" else list(root)
    count = {
        k: sum(int(x.get(k, 0)) for x in suites) for k in ("tests", "failures", "errors", "skipped")
    }
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for x in suites
        for case in x.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    passed = count["tests"] - count["failures"] - count["errors"] - count["skipped"]
    return {"check": "tests", "passed": passed, "failed": count["failures"] + count["errors"],
            "skipped": count["skipped"], "failed_names": failed}  # fmt: skip


def markdown(rows: list[dict], args: argparse.Namespace) -> str:
    lines = [
        "# Accelerator check",
        "",
        f"Written by `bench/gpu_check.py` on {device_name(args.device)}, torch {torch.__version__}.",
        "",
    ]
    updates = [r for r in rows if r["check"] == "update"]
    if updates:
        lines += [
            f"| update | rlpost (FSDP2, {'bf16' if args.mixed_precision == 'bf16' else 'fp32'}) "
            "| plain torch + transformers | ratio |",
            "| --- | --- | --- | --- |",
        ]
    for r in updates:
        plain = [p for p in rows if p["check"] == "plain_update" and p["name"] == r["name"]]
        fits = next((p for p in plain if not p["oom"]), None)
        ooms = ", ".join(
            f"micro-batch {p['micro_batch']}: out of memory" for p in plain if p["oom"]
        )
        shape = f"{r['name']}: {r['tokens']:,} tokens, {r['params'] / 1e6:.0f} M params"
        if r.get("compiled"):
            shape += f", trainer.compile: layers and log-prob kernels (first update {r['warmup_s']:.0f} s)"
        ours = f"{r['tokens_per_s']:,.0f} tok/s ({r['update_s']:.2f} s){_mfu(r)}, peak {r['peak_mem_gib']:.1f} GiB, micro-batch {r['micro_batch']}"
        theirs, ratio = ooms or "n/a", "n/a"
        if fits:
            peak = (
                f", peak {fits['peak_mem_gib']:.1f} GiB" if fits["peak_mem_gib"] is not None else ""
            )
            theirs = f"{fits['tokens_per_s']:,.0f} tok/s ({fits['update_s']:.2f} s){_mfu(fits)}{peak}, micro-batch {fits['micro_batch']}"
            theirs = f"{ooms}; {theirs}" if ooms else theirs
            ratio = f"**{r['tokens_per_s'] / fits['tokens_per_s']:.2f}x**"
        lines.append(f"| {shape} | {ours} | {theirs} | {ratio} |")
    lines += ["", "| check | what | figure |", "| --- | --- | --- |"]
    for r in rows:
        if r["check"] == "logprob_memory":
            what = f"log-probs and entropy (materialised: log-probs only) + backward from hidden states, {r['impl']}, {r['samples']}x{r['tokens']} tokens, vocab {r['vocab']:,}"
            peak = r["peak_extra_gib"]
            fig = (
                f"{peak:.2f} GiB extra" if peak is not None else "n/a on the CPU"
            ) + f", {r['seconds']:.3f} s"
        elif r["check"] == "ipc":
            what = f"CUDA-IPC hand-off, {r['shape']} shape, {r['buckets']} buckets of {r['bucket_mb']} MB"
            fig = f"{r['gb_per_s']:.1f} GB/s ({r['bytes'] / 1e9:.2f} GB in {r['seconds']:.2f} s), exact: {r['exact']}"
        elif r["check"] == "tests":
            what = "`pytest -m gpu` (bench/gpu_check.sh's list)"
            fig = f"{r['passed']} passed, {r['failed']} failed, {r['skipped']} skipped"
            if r["failed_names"]:
                fig += ": " + ", ".join(r["failed_names"])
        else:
            continue
        lines.append(f"| {r['check']} | {what} | {fig} |")
    return "\n".join(lines) + "\n"


def _stopped(signum: int, frame: object) -> None:
    raise TimeoutError("SIGTERM")


def _mfu(r: dict) -> str:
    return f", MFU {r['mfu']:.1%}" if r.get("mfu") is not None else ""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--small", action="store_true", help="tiny shapes (a smoke test of the code)")
    p.add_argument(
        "--only", default="update,plain,logprob,ipc,compiled", help="which checks, comma-separated"
    )
    p.add_argument("--updates", type=int, default=3)
    p.add_argument("--lp-samples", type=int, default=8)
    p.add_argument("--lp-tokens", type=int, default=1024)
    p.add_argument("--bucket-mb", type=int, default=512)
    p.add_argument("--peak-tflops", type=float, default=None)
    p.add_argument(
        "--tests", type=Path, action="append", default=[], help="pytest's JUnit XML to report"
    )
    p.add_argument(
        "--out", type=Path, default=None,
        help="results' path without suffix (default: bench/results/gpu_check on CUDA, "
        "bench/.runs/gpu_check on the CPU, whose figures are not the GPU's)",
    )  # fmt: skip
    p.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        help="the updated model (default: 0.5B; small with --small)",
    )
    p.add_argument(
        "--mixed-precision", default="bf16", choices=["bf16", "none"],
        help="the update's compute: bf16 over fp32 weights, or fp32 (a CPU without bf16 units)",
    )  # fmt: skip
    p.add_argument(
        "--budget-s", type=float, default=120,
        help="the compiled-layer updates (trainer.compile) start only before this many seconds",
    )  # fmt: skip
    p.add_argument(
        "--cpu-shapes", action="store_true",
        help="the update's prompt and response lengths with 8 and 2 samples, for a CPU",
    )  # fmt: skip
    args = p.parse_args()
    if args.out is None:
        args.out = (RESULTS if args.device == "cuda" else ROOT / "bench" / ".runs") / "gpu_check"
    args.shape = args.shape or ("small" if args.small else "0.5B")
    args.update_shapes = (
        SMALL_UPDATE_SHAPES
        if args.small
        else CPU_UPDATE_SHAPES
        if args.cpu_shapes
        else UPDATE_SHAPES
    )
    if args.small:
        args.updates, args.lp_samples, args.lp_tokens = 1, 2, 16
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --device cpu --small to try the code on the CPU")
    only = set(args.only.split(","))
    rows: list[dict] = []
    found = [t for t in args.tests if t.exists()]
    if found:
        rows.append(test_counts(found))
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "m"
        steps = []
        for name in args.update_shapes:
            if "update" in only:
                steps.append((f"update {name}", lambda n=name: [check_update(args, model_dir, n)]))
            if "plain" in only:
                steps.append(
                    (f"plain update {name}", lambda n=name: check_plain_update(args, model_dir, n))
                )
        if "logprob" in only:
            steps.append(("logprob_memory", lambda: check_logprob_memory(args)))
        # trainer.compile's update last: its compiling is the one part of unknown length
        optional = [
            (f"update {name} compiled", lambda n=name: [check_update(args, model_dir, n, True)])
            for name in args.update_shapes
            if "compiled" in only and not args.small  # a CPU compiles for minutes
        ]
        if "ipc" in only:
            # On the CPU the same hand-off maps shared-memory files instead of CUDA-IPC handles.
            shapes = ["small"] if args.small else ["0.5B", "1.5B"]
            steps += [(f"ipc {s}", lambda s=s: [check_ipc(args, s)]) for s in shapes]
        if {"update", "plain", "compiled"} & only:
            start = time.perf_counter()
            random_model_dir(args.shape, model_dir)
            print(f"model: {time.perf_counter() - start:.1f} s", flush=True)
        began = time.perf_counter()
        signal.signal(signal.SIGTERM, _stopped)  # `timeout`: still print what finished
        try:
            for name, step in steps + optional:
                if (name, step) in optional and time.perf_counter() - began > args.budget_s:
                    print(f"{name}: skipped, past --budget-s {args.budget_s:.0f} s", flush=True)
                    continue
                start = time.perf_counter()
                got = step()
                rows += got
                print(f"{name}: {time.perf_counter() - start:.1f} s", json.dumps(got), flush=True)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                Path(f"{args.out}.json").write_text(json.dumps(rows, indent=1) + "\n")
        except TimeoutError:
            print(f"stopped by SIGTERM during {name}: the table holds what finished", flush=True)
    text = markdown(rows, args)
    Path(f"{args.out}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
