"""SGLang prefill/decode disaggregation: P prefill and D decode servers behind
SGLang's router in PD mode, all started and stopped here.

    python -m sglang.launch_server --disaggregation-mode prefill \
        --disaggregation-transfer-backend mooncake|nixl --disaggregation-bootstrap-port B ...
    python -m sglang.launch_server --disaggregation-mode decode ...
    python -m sglang_router.launch_router --pd-disaggregation \
        --prefill http://HOST:PORT B --decode http://HOST:PORT

The router sends each request to a prefill and a decode server, which move
the KV cache between GPUs with the transfer backend (Mooncake or NIXL over
RDMA/NVLink). ``SGLangPDEngine`` is one rollout engine to rlpost: it runs in
one Ray actor that holds ``prefill + decode`` GPUs (server ``i`` on visible
GPU ``i``), posts requests to the router's ``/generate`` with token ids and
``return_logprob``, and loads new weights into every server by writing them
as a safetensors checkpoint and calling ``/update_weights_from_disk`` (the
servers are separate processes, so tensors do not travel by reference).

Targets ``sglang==0.5.23`` and ``sglang-router==0.3.2``; needs CUDA GPUs and,
for the transfer backend, Mooncake or NIXL installed.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from rlpost.rollout.base import GenerationRequest, GenerationResult
from rlpost.rollout.sglang.engine import completion, sampling_params


@dataclass(frozen=True)
class SGLangPDConfig:
    model_path: str
    prefill_replicas: int = 1
    decode_replicas: int = 1
    transfer_backend: Literal["mooncake", "nixl"] = "mooncake"
    dtype: str = "auto"
    max_model_len: int = 4096
    mem_fraction_static: float = 0.5
    seed: int = 0
    host: str = "127.0.0.1"
    start_timeout_s: float = 600.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command(
    cfg: SGLangPDConfig, mode: str, gpu: int, port: int, bootstrap: int
) -> list[str]:
    """``sglang.launch_server`` for one prefill or decode server."""
    cmd = [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", cfg.model_path,
        "--host", cfg.host, "--port", str(port),
        "--base-gpu-id", str(gpu),
        "--dtype", cfg.dtype,
        "--context-length", str(cfg.max_model_len),
        "--mem-fraction-static", str(cfg.mem_fraction_static),
        "--random-seed", str(cfg.seed),
        "--enable-memory-saver",
        "--disaggregation-mode", mode,
        "--disaggregation-transfer-backend", cfg.transfer_backend,
    ]  # fmt: skip
    if mode == "prefill":
        cmd += ["--disaggregation-bootstrap-port", str(bootstrap)]
    return cmd


def router_command(
    cfg: SGLangPDConfig, prefill: list[tuple[str, int]], decode: list[str], port: int
) -> list[str]:
    """``sglang_router.launch_router`` in PD mode over the servers' URLs."""
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation"]
    for url, bootstrap in prefill:
        cmd += ["--prefill", url, str(bootstrap)]
    for url in decode:
        cmd += ["--decode", url]
    return cmd + ["--host", cfg.host, "--port", str(port)]


def _post(url: str, payload: dict[str, object], timeout: float = 600.0) -> Any:  # the JSON body
    req = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        body = resp.read()
    return json.loads(body) if body else None


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False


class SGLangPDEngine:
    """P prefill + D decode SGLang servers and SGLang's PD router, as one engine."""

    def __init__(self, cfg: SGLangPDConfig):
        self.cfg = cfg
        self._procs: list[subprocess.Popen] = []
        self.prefill_urls: list[str] = []
        self.decode_urls: list[str] = []
        self._weights_dir = tempfile.mkdtemp(prefix="rlpost-sglang-weights-")
        self._requests = 0
        self._weight_loads = 0
        self._open = asyncio.Event()
        self._open.set()
        self._in_flight = 0
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        c = self.cfg
        prefill: list[tuple[str, int]] = []
        gpu = 0
        for mode, count in (("prefill", c.prefill_replicas), ("decode", c.decode_replicas)):
            for _ in range(count):
                port, bootstrap = free_port(), free_port()
                url = f"http://{c.host}:{port}"
                self._procs.append(subprocess.Popen(server_command(c, mode, gpu, port, bootstrap)))
                gpu += 1
                if mode == "prefill":
                    prefill.append((url, bootstrap))
                    self.prefill_urls.append(url)
                else:
                    self.decode_urls.append(url)
        self._wait(self.prefill_urls + self.decode_urls)
        router_port = free_port()
        self.router_url = f"http://{c.host}:{router_port}"
        self._procs.append(
            subprocess.Popen(router_command(c, prefill, self.decode_urls, router_port))
        )
        self._wait([self.router_url])

    def _wait(self, urls: list[str]) -> None:
        deadline = time.monotonic() + self.cfg.start_timeout_s
        pending = list(urls)
        while pending:
            for p in self._procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args!r} exited with {p.returncode}")
            pending = [u for u in pending if not _healthy(u)]
            if pending and time.monotonic() > deadline:
                raise TimeoutError(
                    f"SGLang servers not healthy after {self.cfg.start_timeout_s}s: {pending}"
                )
            if pending:
                time.sleep(2.0)

    @property
    def servers(self) -> list[str]:
        return self.prefill_urls + self.decode_urls

    # -- generation ----------------------------------------------------------

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        await self._open.wait()
        self._in_flight += 1
        self._requests += 1
        try:
            outs = await asyncio.gather(
                *(
                    asyncio.to_thread(
                        _post,
                        f"{self.router_url}/generate",
                        {
                            "input_ids": list(request.prompt_ids),
                            "sampling_params": sampling_params(request, k),
                            "return_logprob": True,
                        },
                    )
                    for k in range(request.sampling.n)
                )
            )
        finally:
            self._in_flight -= 1
        return GenerationResult(list(request.prompt_ids), [completion(o) for o in outs])

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        async def run() -> list[GenerationResult]:
            return list(await asyncio.gather(*(self.agenerate(r) for r in requests)))

        return asyncio.run(run())

    # -- weights and memory --------------------------------------------------

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Write the weights as a checkpoint beside the model's config and tokenizer,
        then every server loads it (and flushes its prefix cache)."""
        from safetensors.torch import save_file

        version = os.path.join(self._weights_dir, f"v{self._weight_loads + 1}")
        os.makedirs(version)
        for name in os.listdir(self.cfg.model_path):
            src = os.path.join(self.cfg.model_path, name)
            if os.path.isfile(src) and not name.endswith((".safetensors", ".bin", ".index.json")):
                shutil.copy(src, version)
        tensors = {n: t.detach().cpu().contiguous() for n, t in named_tensors}
        save_file(tensors, os.path.join(version, "model.safetensors"))
        for url in self.servers:
            out = _post(f"{url}/update_weights_from_disk", {"model_path": version})
            if isinstance(out, dict) and not out.get("success", True):
                raise RuntimeError(f"{url}: update_weights_from_disk failed: {out.get('message')}")
        if self._weight_loads:
            shutil.rmtree(
                os.path.join(self._weights_dir, f"v{self._weight_loads}"), ignore_errors=True
            )
        self._weight_loads += 1

    async def aload_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self._open.clear()
        try:
            while self._in_flight:
                await asyncio.sleep(0.01)
            await asyncio.to_thread(self.load_weights, list(named_tensors))
        finally:
            self._open.set()

    def reset_prefix_cache(self) -> None:
        for url in self.servers:
            _post(f"{url}/flush_cache", {})

    async def asleep(self) -> None:
        self._open.clear()
        while self._in_flight:
            await asyncio.sleep(0.01)
        for url in self.servers:
            await asyncio.to_thread(_post, f"{url}/release_memory_occupation", {})

    async def awake(self) -> None:
        for url in self.servers:
            await asyncio.to_thread(_post, f"{url}/resume_memory_occupation", {})
        self._open.set()

    def stats(self) -> dict[str, float]:
        return {
            "requests": float(self._requests),
            "weight_loads": float(self._weight_loads),
            "prefix_cache_queries": 0.0,
            "prefix_cache_hits": 0.0,
            "prefix_cache_hit_rate": 0.0,
        }

    def close(self) -> None:
        """Stop the router and the servers (each process and its children)."""
        for p in reversed(self._procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(self._procs):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        self._procs = []
        shutil.rmtree(self._weights_dir, ignore_errors=True)
