"""Trainer rank 0's memory during a weight sync: the whole model gathered at once
(``named_weights``, what ``rollout.weight_sync=object_store`` sends) against the
layer-by-layer stream the ``collective`` and ``ipc`` syncs send from
(``weight_stream``), on the FSDP2 engine and on the Megatron engine at tensor
parallel 2, two ranks over gloo.

    python bench/stream_memory.py                  # writes bench/results/stream_memory.md and .json
    python bench/stream_memory.py --sizes 30M      # a quick look

Each rank builds its engine from a random Qwen2-shaped model directory (float32,
the shapes of bench/weight_sync.py), then rank 0 hands the memory freed inside its
heap back to the OS (``trim_host_heap``, so that the rise is the sync's own) and
measures the rise of its resident set's high-water mark (``VmHWM``, reset through
``/proc/self/clear_refs``) over one of:

- ``gather``: ``named_weights()``, the full state on rank 0, kept until the end;
  each mode runs in fresh processes, so neither reuses memory the other freed;
- ``stream``: ``rlpost.runtime.weight_wire.IpcSender`` over ``weight_stream()``,
  every bucket packed and handed out as the ``ipc`` sync does, none read back
  (the other rank runs its share of the gathers, as ``TrainerWorker.ipc_drive``);
- ``collective``: ``TrainerWorker.open_weight_group`` and ``send_weights`` on both
  ranks, as ``rollout.weight_sync=collective`` drives them, broadcasting to a
  third process, the bench's stand-in receiver: rank 1 of the weight group, which
  takes every bucket through ``SyncGroup.receive`` and drops it (its rise is
  measured the same way).

The gather's peak is the whole model. The stream's is one bucket and the part
being gathered: 1.1-1.7 times the largest bucket (the embedding, where it is
larger than a bucket) with ``ipc``, 1.0-1.6 with ``collective``. Shards are
broadcast straight into their full tensor (not gloo's all-gather, which gathers
into a buffer of its own and copies out of it), a tensor with a bucket of its own
is sent as it is (``ipc``: gathered straight into its shared-memory file), a
bucket is packed as its tensors come, and the heap's freed memory goes back to
the OS between parts. Before these, the stream took 2.1-4.1 times the largest
bucket: a transient second copy in each gather, a third in the bucket, and the
heap's free space. The receiver holds the bucket it receives into and the one
before, kept by the last tensor it handed on (a loader holds it until the next
arrives): 1.6-2.0 times the largest bucket, 2.0 where Megatron's tied head follows
the embedding (two of the largest buckets and 3 MB of the process's own).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
RESULTS = ROOT / "bench" / "results"

from weight_sync import SIZES, _status_kib  # noqa: E402


def model_dir(size: str, out: Path) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hidden, layers, heads, kv, mlp, vocab = SIZES[size]
    cfg = Qwen2Config(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv, intermediate_size=mlp, vocab_size=vocab,
        max_position_embeddings=512, tie_word_embeddings=True, torch_dtype="float32",
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(out)
    return out


def _engine(kind: str, path: str, rank: int, port: int):  # type: ignore[no-untyped-def]
    common = {"model_path": path, "lr": 1e-5, "lr_warmup_steps": 0}
    init = f"tcp://127.0.0.1:{port}"
    if kind == "fsdp2":
        from rlpost.trainers.fsdp.engine import FSDPEngine, FSDPEngineConfig

        return FSDPEngine(FSDPEngineConfig(**common), rank, 2, init)
    from rlpost.trainers.megatron.engine import (
        MegatronEngine,
        MegatronEngineConfig,
        MegatronParallel,
    )

    cfg = MegatronEngineConfig(parallel=MegatronParallel(tp=2), **common)
    return MegatronEngine(cfg, rank, 2, init)


def _rank(
    rank: int, kind: str, path: str, port: int, mode: str, bucket_mb: int, out: str, group_port: int
) -> None:
    if mode == "collective" and rank == 2:
        _receiver(group_port, out)
        return
    from rlpost.runtime import device as devices
    from rlpost.runtime.weight_wire import IpcSender
    from rlpost.workers.trainer_worker import TrainerWorker

    torch.set_num_threads(1)
    engine = _engine(kind, path, rank, port)
    torch.distributed.barrier()
    if mode == "collective":
        # the trainer's side of rollout.weight_sync=collective, as the CLI drives it:
        # rank 0 opens the weight group, then every rank runs send_weights
        worker = TrainerWorker(threads=1)
        worker.engine = engine
        if rank == 0:
            worker.open_weight_group(f"tcp://127.0.0.1:{group_port}", 2, 0, 600.0)
            worker.weight_group.broadcast(torch.zeros(1))  # the receiver has joined
    # what building the engine freed goes back to the OS first, so that the rise
    # is the sync's own (the stream trims the heap between parts)
    devices.trim_host_heap("cpu")
    Path("/proc/self/clear_refs").write_text("5")
    base = _status_kib("VmRSS")
    held = None
    sent: dict[str, int] = {}
    if mode == "gather":
        held = engine.named_weights()
    elif mode == "collective":
        sent = worker.send_weights(bucket_mb << 20)
    elif rank == 0:
        sender = IpcSender(engine, bucket_mb << 20, torch.device("cpu"))
        for _ in sender.plan.buckets:
            sender.next()
        sent = sender.close()
    else:
        for _ in engine.weight_stream()[1]:
            pass
    extra = (_status_kib("VmHWM") - base) / 1024
    torch.distributed.barrier()
    if rank == 0:
        row = {"extra_mb": extra, "gathered": held is not None}
        if sent:
            row["peak_bucket_mb"] = sent["peak"] / 2**20
            row["sent_mb"] = sent["bytes"] / 2**20
        Path(out).write_text(json.dumps(row))


def _receiver(group_port: int, out: str) -> None:
    """The bench's stand-in receiver: rank 1 of the weight group, as a replica's
    worker joins it (rollout/vllm/worker_ext.py), receiving every bucket through
    ``SyncGroup.receive`` and dropping its tensors where vLLM's loader would copy
    them into the model. Its rise is the bucket it receives into; writes
    ``{out}.receiver``."""
    from rlpost.runtime import device as devices
    from rlpost.runtime.weight_wire import SyncGroup, SyncStats

    torch.set_num_threads(1)
    group = SyncGroup("127.0.0.1", group_port, 1, 2, timeout_s=600.0)
    group.broadcast(torch.zeros(1))  # with rank 0's, before either measures
    devices.trim_host_heap("cpu")
    Path("/proc/self/clear_refs").write_text("5")
    base = _status_kib("VmRSS")
    stats = SyncStats()
    for _ in group.receive(stats):
        pass
    extra = (_status_kib("VmHWM") - base) / 1024
    row = {"extra_mb": extra, "peak_bucket_mb": stats.peak_bucket_bytes / 2**20}
    Path(f"{out}.receiver").write_text(json.dumps(row))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _layer_mb(size: str) -> tuple[float, float]:
    """(one decoder layer's MB, the embedding's MB), float32."""
    hidden, _, heads, kv, mlp, vocab = SIZES[size]
    head = hidden // heads
    attn = hidden * hidden * 2 + hidden * kv * head * 2 + hidden + kv * head * 2
    layer = attn + 3 * hidden * mlp + 2 * hidden
    return layer * 4 / 2**20, vocab * hidden * 4 / 2**20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", nargs="+", default=["30M", "150M", "500M"], choices=list(SIZES))
    p.add_argument("--engines", nargs="+", default=["fsdp2", "megatron"])
    p.add_argument("--bucket-mb", type=int, default=64)
    p.add_argument("--out", type=Path, default=RESULTS / "stream_memory")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            path = str(model_dir(size, Path(tmp) / size))
            layers = SIZES[size][1]
            layer_mb, embed_mb = _layer_mb(size)
            model_mb = embed_mb + layers * layer_mb
            for kind in args.engines:
                row = {"engine": kind, "size": size, "model_mb": model_mb,
                       "layer_mb": layer_mb, "embedding_mb": embed_mb, "bucket_mb": args.bucket_mb}  # fmt: skip
                for mode in ("gather", "stream", "collective"):
                    out = Path(tmp) / f"{kind}-{size}-{mode}.json"
                    # collective: two trainer ranks and the stand-in receiver (process 2)
                    mp.start_processes(
                        _rank, args=(kind, path, _free_port(), mode, args.bucket_mb, str(out),
                                     _free_port()),
                        nprocs=3 if mode == "collective" else 2, join=True, start_method="spawn",
                    )  # fmt: skip
                    got = json.loads(out.read_text())
                    row[f"{mode}_extra_mb"] = got["extra_mb"]
                    if mode == "stream":
                        row["peak_bucket_mb"] = got["peak_bucket_mb"]
                        row["model_mb"] = got["sent_mb"]  # checkpoint format, tied head included
                    if mode == "collective":
                        row["collective_peak_bucket_mb"] = got["peak_bucket_mb"]
                        got = json.loads(Path(f"{out}.receiver").read_text())
                        row["receiver_extra_mb"] = got["extra_mb"]
                rows.append(row)
                print(json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.json").write_text(json.dumps(rows, indent=1) + "\n")
    text = markdown(rows, args.bucket_mb)
    Path(f"{args.out}.md").write_text(text)
    print(text)


def markdown(rows: list[dict], bucket_mb: int) -> str:
    lines = [
        "# Trainer rank 0's memory during a weight sync: whole gather against the stream",
        "",
        f"Written by `bench/stream_memory.py` on {platform.machine()}, {os.cpu_count()} CPU "
        f"cores; two ranks over gloo (Megatron: tensor parallel 2); float32; buckets of "
        f"{bucket_mb} MB (a tensor larger than that has a bucket of its own). Extra MB: the "
        "rise of a process's resident high-water mark over its resident memory before the "
        "sync; model MB: what the sync sends (the tied head included). Sender `ipc`: "
        "`IpcSender` over `weight_stream()`; `collective`: `TrainerWorker.send_weights` "
        "over the weight group (`SyncGroup`, gloo) to a receiving process that takes "
        "every bucket and drops it (the receiver column; the `ipc` receiver maps the "
        "sender's buckets instead). The receiver holds the bucket it receives into and "
        "the one before, which the last tensor handed on keeps until the next arrives "
        "(the replica's loader holds it across `next()`): 2 buckets and a few MB of its "
        "own where two of the largest meet (Megatron sends the tied head just after the "
        "embedding).",
        "",
        "```bash",
        "python bench/stream_memory.py",
        "```",
        "",
        "| engine | params (model MB) | layer MB | embedding MB | gather extra MB | sender | "
        "rank 0 extra MB | / gather | / largest bucket | receiver extra MB | "
        "receiver / largest bucket |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        head = (
            f"| {r['engine']} | {r['size']} ({r['model_mb']:.0f}) | {r['layer_mb']:.0f} | "
            f"{r['embedding_mb']:.0f} | {r['gather_extra_mb']:.0f} |"
        )
        sends = [("ipc", r["stream_extra_mb"], r["peak_bucket_mb"], None)]
        if "collective_extra_mb" in r:
            sends.append(
                ("collective", r["collective_extra_mb"], r["collective_peak_bucket_mb"],
                 r["receiver_extra_mb"])
            )  # fmt: skip
        for sender, extra, bucket, received in sends:
            tail = "- | - |" if received is None else f"{received:.0f} | {received / bucket:.1f} |"
            lines.append(
                f"{head} {sender} | {extra:.0f} | {extra / r['gather_extra_mb']:.2f} | "
                f"{extra / bucket:.1f} | {tail}"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
