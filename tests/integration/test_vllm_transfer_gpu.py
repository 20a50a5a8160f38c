"""The collective sync through vLLM's own NCCL weight transfer
(``rlpost.runtime.vllm_transfer``) on CUDA: a trainer process on one GPU sends a
second model's weights to a vLLM engine on another, and the engine then generates
exactly what it generates after loading those weights through the object-store
path. Needs two GPUs (NCCL does not put two ranks on one device) and vLLM with
CUDA; skipped elsewhere."""

from __future__ import annotations

import multiprocessing as mp
import socket

import pytest

pytest.importorskip("vllm")

from rlpost.models.tiny import build_tiny_model  # noqa: E402
from rlpost.rollout.base import GenerationRequest, SamplingConfig  # noqa: E402


def _send(address: str, path: str, bucket_bytes: int, done: mp.Queue) -> None:
    """The trainer's side, in a process of its own on the second GPU."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlpost.runtime import device as devices
    from rlpost.runtime.vllm_transfer import VllmNcclSender

    devices.set_device(devices.CUDA, 1)
    state = AutoModelForCausalLM.from_pretrained(path).state_dict()
    specs = [(n, tuple(t.shape), t.dtype) for n, t in state.items()]
    sender = VllmNcclSender(address, world_size=2, timeout_s=120, device=torch.device("cuda", 1))
    stats = sender.send(iter(state.items()), bucket_bytes, specs)
    sender.close()
    done.put({"buckets": stats.buckets, "bytes": stats.bytes, "peak": stats.peak_bucket_bytes})


@pytest.mark.gpu
def test_weights_reach_a_vllm_engine_through_vllm_own_nccl_transfer(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from rlpost.rollout.vllm import VLLMEngineConfig
    from rlpost.rollout.vllm.engine import VLLMEngine
    from rlpost.runtime.vllm_transfer import figures, layout

    if torch.cuda.device_count() < 2:
        pytest.skip("NCCL needs the trainer and the replica on two GPUs")
    start = build_tiny_model("tiny", tmp_path / "start", seed=0)
    other = build_tiny_model("tiny", tmp_path / "other", seed=1)
    bucket = 1 << 20
    cfg = VLLMEngineConfig(
        model_path=str(start), kv_cache_gib=0.25, device="cuda", gpu_memory_utilization=0.2,
        weight_transfer="nccl", weight_transfer_bucket_bytes=bucket,
    )  # fmt: skip
    engine = VLLMEngine(cfg)
    greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=16)
    prompt = [5, 6, 7, 8, 9]

    def tokens() -> list[int]:
        return engine.generate([GenerationRequest(prompt, greedy)])[0].completions[0].token_ids

    before = tokens()
    state = AutoModelForCausalLM.from_pretrained(other).state_dict()
    specs = [(n, tuple(t.shape), t.dtype) for n, t in state.items()]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    ctx = mp.get_context("spawn")
    done = ctx.Queue()
    trainer = ctx.Process(target=_send, args=(address, str(other), bucket, done))
    trainer.start()
    engine.open_weight_group(address, 1, 2, 0, 120)
    received = engine.receive_weights(layout(specs))
    sent = done.get(timeout=120)
    trainer.join(timeout=60)
    assert trainer.exitcode == 0
    assert sent == received == figures(specs, bucket)
    synced = tokens()
    engine.load_weights(state.items())  # the object-store path, the reference
    assert synced == tokens()
    assert synced != before  # another model's weights: the sync changed the engine
