"""Weight sync time and peak extra memory: the object store against the collective
weight group and the colocated hand-off (``rollout.weight_sync``), on one Ray node
and across two.

    python bench/weight_sync.py            # writes bench/results/weight_sync.md and .json
    python bench/weight_sync.py --sizes 1M 30M --repeats 1   # a quick look

What is timed is the transfer itself, between two Ray actors that hold a random
Qwen2-shaped model's float32 weights (the trainer's side) and a model's worth of
tensors of their own (the rollout's side, which copies every tensor into its
own, as vLLM's loader does):

- ``object_store``: the trainer's rank returns its weights from a call (one
  copy into Ray's object store, as ``TrainerGroup.weights_ref``), the replica
  gets them as the argument of its load (fetched from the store; across nodes,
  copied to its node's store first) and copies them into its tensors;
- ``collective``: ``rlpost.runtime.weight_wire.SyncGroup`` (gloo), the layout
  sent once at the first sync, then buckets of ``bucket_mb``;
- ``ipc`` (one node): ``rlpost.runtime.weight_wire.IpcSender`` packs each bucket
  into a shared-memory file that the replica's side maps and copies from
  (``rlpost.workers.ipc_source.IpcSource``, as the vLLM worker reads it); only
  the handles go through Ray. On a GPU the same code hands out CUDA-IPC handles.

Peak extra memory is each actor's resident-memory high-water mark during the
sync above its resident memory before it (``VmHWM``, reset through
``/proc/self/clear_refs``), the larger of the two sides; pages of the object
store that a side touches count as its own. Two nodes are two Ray nodes on this
machine (``ray start`` twice, as tests/integration/test_multinode.py starts
them): the bytes cross a socket as they would between machines, but both nodes
share the machine's memory and cores. Each figure is the median of
``--repeats`` syncs after one untimed sync.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results"
RAY = str(Path(sys.executable).parent / "ray")

SIZES = {
    # name: hidden, layers, heads, KV heads, MLP, vocabulary (Qwen2 shapes, tied head)
    "1M": (64, 2, 4, 2, 256, 8192),
    "30M": (384, 6, 6, 2, 1536, 32000),
    "150M": (768, 12, 12, 4, 3072, 32000),
    "500M": (896, 24, 14, 2, 4864, 151_936),
}


def shapes(size: str) -> list[tuple[str, tuple[int, ...]]]:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hidden, layers, heads, kv, mlp, vocab = SIZES[size]
    cfg = Qwen2Config(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv, intermediate_size=mlp, vocab_size=vocab,
        tie_word_embeddings=True,
    )  # fmt: skip
    with torch.device("meta"):
        model = Qwen2ForCausalLM(cfg)
    return [(n, tuple(p.shape)) for n, p in model.state_dict().items()]


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


class Side:
    """One side of a sync: a model's worth of float32 tensors and what a sync
    did to its memory."""

    def __init__(self, layout: list, fill: bool):
        import torch

        torch.set_num_threads(1)
        g = torch.Generator().manual_seed(0)
        make = (lambda s: torch.randn(s, generator=g)) if fill else torch.empty
        self.weights = {n: make(s) for n, s in layout}
        self.group = None
        self.base = 0

    def address(self) -> str:
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            return f"{ray.util.get_node_ip_address()}:{s.getsockname()[1]}"

    def open(self, address: str, rank: int) -> None:
        from rlpost.runtime.weight_wire import SyncGroup

        host, _, port = address.rpartition(":")
        self.group = SyncGroup(host, int(port), rank, 2, timeout_s=600)

    def begin(self) -> None:
        """Reset the high-water mark to the resident memory now."""
        Path("/proc/self/clear_refs").write_text("5")
        self.base = _status_kib("VmRSS")

    def peak_extra_mb(self) -> float:
        return (_status_kib("VmHWM") - self.base) / 1024

    # object store
    def named(self) -> list:
        return list(self.weights.items())

    def load(self, named: list) -> float:
        for name, tensor in named:
            self.weights[name].copy_(tensor)
        return self.peak_extra_mb()

    # collective
    def send(self, bucket_mb: int) -> float:
        assert self.group is not None
        self.group.send(iter(self.weights.items()), bucket_mb << 20)
        return self.peak_extra_mb()

    def receive(self) -> float:
        assert self.group is not None
        for name, tensor in self.group.receive():
            self.weights[name].copy_(tensor)
        return self.peak_extra_mb()

    # ipc (one node): this side stands in for trainer rank 0's engine
    rank = 0

    def named_weights(self) -> list:
        return list(self.weights.items())

    def ipc_open(self, bucket_mb: int):  # type: ignore[no-untyped-def]
        import torch

        from rlpost.runtime.weight_wire import IpcSender

        self.sender = IpcSender(self, bucket_mb << 20, torch.device("cpu"))
        return self.sender.plan

    def ipc_next(self):  # type: ignore[no-untyped-def]
        return self.sender.next()

    def ipc_close(self) -> float:
        self.sender.close()
        return self.peak_extra_mb()

    def receive_ipc(self, sender, plan) -> float:  # type: ignore[no-untyped-def]
        from rlpost.runtime.weight_wire import SyncStats
        from rlpost.workers.ipc_source import IpcSource

        for name, tensor in IpcSource(sender, plan).tensors(SyncStats()):
            self.weights[name].copy_(tensor)
        return self.peak_extra_mb()


def one_setting(size: str, nodes: int, engines: list[tuple[str, int]], repeats: int) -> list[dict]:
    """Every engine (name, bucket MB) at one size: the two sides made once."""
    import ray

    layout = shapes(size)
    params = sum(_numel(s) for _, s in layout)
    where = (
        {"resources": {"head": 0.01}},
        {"resources": {"worker_node" if nodes == 2 else "head": 0.01}},
    )
    Remote = ray.remote(num_cpus=0)(Side)
    trainer = Remote.options(**where[0]).remote(layout, True)
    rollout = Remote.options(**where[1]).remote(layout, False)
    rows = []
    for engine, bucket_mb in engines:
        if engine == "collective":
            address = ray.get(trainer.address.remote())
            ray.get([trainer.open.remote(address, 0), rollout.open.remote(address, 1)])
        times, peaks = [], []
        for i in range(repeats + 1):
            ray.get([trainer.begin.remote(), rollout.begin.remote()])
            start = time.perf_counter()
            if engine == "object_store":
                got = ray.get(rollout.load.remote(trainer.named.remote()))
                sender = ray.get(trainer.peak_extra_mb.remote())
            elif engine == "ipc":
                plan = trainer.ipc_open.remote(bucket_mb)
                got = ray.get(rollout.receive_ipc.remote(trainer, plan))
                sender = ray.get(trainer.ipc_close.remote())
            else:
                sender, got = ray.get([trainer.send.remote(bucket_mb), rollout.receive.remote()])
            seconds = time.perf_counter() - start
            if i:  # the first is a warm-up (and sends the layout)
                times.append(seconds)
                peaks.append(max(sender, got))
        rows.append({
            "engine": engine, "nodes": nodes, "size": size, "params": params,
            "bucket_mb": bucket_mb if engine != "object_store" else None,
            "sync_s": statistics.median(times), "peak_extra_mb": statistics.median(peaks),
            "model_mb": params * 4 / 2**20,
        })  # fmt: skip
        r = rows[-1]
        print(f"{size:>5} {nodes} node(s) {engine:12s} bucket {bucket_mb:>4} MB: "
              f"{r['sync_s']:.3f} s, peak extra {r['peak_extra_mb']:.0f} MB "
              f"(model {r['model_mb']:.0f} MB)", flush=True)  # fmt: skip
    ray.kill(trainer)
    ray.kill(rollout)
    return rows


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


class Cluster:
    """Ray nodes on this machine, started with ``ray start``: a head (resource
    ``head``) and, for two nodes, a worker node (resource ``worker_node``)."""

    def __init__(self, nodes: int):
        self.tmp = Path(tempfile.mkdtemp(prefix="rlpost-ws-", dir="/tmp"))
        self.env = {**os.environ, "RAY_TMPDIR": str(self.tmp), "RAY_AUTH_MODE": "disabled"}
        port = _free_port()
        self.address = f"127.0.0.1:{port}"
        self._ray("start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                  '--resources={"head": 1}', "--node-ip-address=127.0.0.1")  # fmt: skip
        if nodes == 2:
            self._ray("start", f"--address={self.address}", "--num-cpus=2",
                      '--resources={"worker_node": 1}', "--node-ip-address=127.0.0.1")  # fmt: skip

    def _ray(self, *args: str) -> None:
        subprocess.run([RAY, *args], env=self.env, check=True, capture_output=True, timeout=120)

    def stop(self) -> None:
        subprocess.run([RAY, "stop", "--force"], env=self.env, capture_output=True, timeout=120)
        shutil.rmtree(self.tmp, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def markdown(rows: list[dict], args: argparse.Namespace) -> str:
    lines = [
        "# Weight sync: object store, collective weight group and colocated hand-off",
        "",
        f"Written by `bench/weight_sync.py` on {platform.machine()}, {os.cpu_count()} CPU "
        f"cores; median of {args.repeats} syncs after a warm-up; float32 weights.",
        "",
        "```bash",
        "python bench/weight_sync.py",
        "```",
        "",
        "| params | model MB | nodes | engine | bucket MB | sync s | peak extra MB | extra / model |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        bucket = "" if r["bucket_mb"] is None else str(r["bucket_mb"])
        lines.append(
            f"| {r['size']} ({r['params'] / 1e6:.1f} M) | {r['model_mb']:.0f} | {r['nodes']} | "
            f"{r['engine']} | {bucket} | {r['sync_s']:.3f} | {r['peak_extra_mb']:.0f} | "
            f"{r['peak_extra_mb'] / r['model_mb']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    p.add_argument("--nodes", nargs="+", type=int, default=[1, 2], choices=[1, 2])
    p.add_argument("--buckets", nargs="+", type=int, default=[64, 512])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS / "weight_sync")
    args = p.parse_args()
    import ray

    engines = [("object_store", 0)] + [("collective", b) for b in args.buckets]
    rows: list[dict] = []
    for nodes in args.nodes:
        # ipc maps memory of the trainer's process: one node only
        here = engines + ([("ipc", b) for b in args.buckets] if nodes == 1 else [])
        cluster = Cluster(nodes)
        try:
            ray.init(address=cluster.address, logging_level="ERROR")
            for size in args.sizes:
                rows += one_setting(size, nodes, here, args.repeats)
        finally:
            ray.shutdown()
            cluster.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.json").write_text(json.dumps(rows, indent=1) + "\n")
    text = markdown(rows, args)
    Path(f"{args.out}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
