"""Ray shell around one rollout engine (a replica)."""

from __future__ import annotations

import os
from typing import Any

import torch


class RolloutWorker:
    def __init__(self, engine_cfg: Any, threads: int):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        # vLLM's per-reload INFO/WARNING lines drown the progress bar.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        torch.set_num_threads(threads)
        from rollout.vllm import VLLMEngine

        self.engine = VLLMEngine(engine_cfg)

    def generate(self, requests: list) -> list:
        return self.engine.generate(requests)

    def load_weights(self, named_tensors: list) -> float:
        import time

        start = time.perf_counter()
        self.engine.load_weights(named_tensors)
        return time.perf_counter() - start

    def stats(self) -> dict[str, float]:
        return self.engine.stats()
