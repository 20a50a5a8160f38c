"""The parts of the collective sync through vLLM's own weight-transfer engine
(``rlpost.runtime.vllm_transfer``) that need no GPU: the payloads parse as vLLM's
own dataclasses, the bucket cuts are those of vLLM's own packer, the layout check,
the watchdog, when the path is taken, and the replica's written-parameter check on
buckets handed over whole. The transfer itself runs on CUDA only (not here)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch

from rlpost.runtime import vllm_transfer

pytest.importorskip("vllm")

SPECS = [
    ("embed.weight", (10,), torch.float32),  # 40 bytes
    ("layer.0.w", (15,), torch.float16),  # 30
    ("layer.1.w", (50,), torch.uint8),  # 50
    ("lm_head.weight", (5,), torch.int16),  # 10
]


def test_payloads_parse_as_vllm_own_init_and_update_infos():
    from vllm.distributed.weight_transfer.nccl_engine import (
        NCCLWeightTransferInitInfo,
        NCCLWeightTransferUpdateInfo,
    )

    info = NCCLWeightTransferInitInfo(
        **vllm_transfer.worker_init_info("tcp://10.0.0.2:23456", 3, 5, 1024)
    )
    assert (info.master_address, info.master_port, info.rank_offset, info.world_size) == (
        "10.0.0.2", 23456, 3, 5,
    )  # fmt: skip
    assert (info.packed, info.packed_buffer_size_bytes, info.packed_num_buffers) == (True, 1024, 2)
    update = NCCLWeightTransferUpdateInfo(**vllm_transfer.layout(SPECS))
    assert update.names == ["embed.weight", "layer.0.w", "layer.1.w", "lm_head.weight"]
    assert update.dtype_names == ["float32", "float16", "uint8", "int16"]
    assert update.shapes == [[10], [15], [50], [5]]
    # the worker turns dtype names back with getattr(torch, name)
    assert [getattr(torch, d) for d in update.dtype_names] == [s[2] for s in SPECS]


@pytest.mark.filterwarnings("ignore:Tensor .* exceeds buffer_size_bytes")
def test_bucket_cuts_are_those_of_vllm_own_packer():
    from vllm.distributed.weight_transfer.packed_tensor import pack_tensors

    # 40 + 30 = 70 > 60 closes the first bucket; 50 + 10 = 60 is not above 60: the end
    assert vllm_transfer.bucket_sizes(SPECS, 60) == [70, 60]
    assert vllm_transfer.figures(SPECS, 60) == {"buckets": 2, "bytes": 130, "peak": 130}
    # 40 > 30; 30 is not above 30, + 50 = 80 > 30; 10
    assert vllm_transfer.bucket_sizes(SPECS, 30) == [40, 80, 10]
    assert vllm_transfer.figures(SPECS, 30) == {"buckets": 3, "bytes": 130, "peak": 120}
    for bucket in (1, 30, 60, 69, 70, 1000):
        items = iter([(n, torch.zeros(s, dtype=d)) for n, s, d in SPECS])
        sizes = []
        while (chunk := pack_tensors(items, lambda item: item[1], bucket)) is not None:
            sizes.append(chunk.packed_tensor.numel())
        assert vllm_transfer.bucket_sizes(SPECS, bucket) == sizes, bucket


def test_tensors_are_checked_against_the_layout_the_replicas_have():
    items = [(n, torch.zeros(s, dtype=d)) for n, s, d in SPECS]
    out = list(vllm_transfer.checked(iter(items), SPECS, torch.device("cpu")))
    assert [n for n, _ in out] == [s[0] for s in SPECS]
    wrong = [*items[:2], ("layer.1.w", torch.zeros(51, dtype=torch.uint8)), items[3]]
    with pytest.raises(ValueError, match=r"tensor 2 is \('layer.1.w', \(51,\)"):
        list(vllm_transfer.checked(iter(wrong), SPECS, torch.device("cpu")))
    with pytest.raises(ValueError, match="sent 3 tensors, its layout lists 4"):
        list(vllm_transfer.checked(iter(items[:3]), SPECS, torch.device("cpu")))
    extra = [*items, ("extra", torch.zeros(1))]
    with pytest.raises(ValueError, match="the first extra is 'extra'"):
        list(vllm_transfer.checked(iter(extra), SPECS, torch.device("cpu")))


def test_watchdog_aborts_a_blocked_call_and_says_so():
    released = threading.Event()
    start = time.perf_counter()
    with pytest.raises(TimeoutError, match="the test's transfer took longer than 0.2 s"):
        with vllm_transfer.watchdog(0.2, released.set, "the test's transfer"):
            # stands in for a collective whose peer died: only the abort ends it
            if not released.wait(10):
                raise AssertionError("the watchdog did not abort")
    assert 0.2 <= time.perf_counter() - start < 5
    aborted = []
    with vllm_transfer.watchdog(5, lambda: aborted.append(1), "a quick one"):
        pass
    assert aborted == []
    with pytest.raises(TimeoutError):  # an error the abort caused is reported as the timeout
        with vllm_transfer.watchdog(0.1, released.clear, "failing"):
            while released.is_set():
                time.sleep(0.01)
            raise RuntimeError("NCCL error: communicator aborted")


def _rollout(**kw):
    base = dict(weight_sync="collective", name="vllm", pd=SimpleNamespace(enabled=False))
    return SimpleNamespace(**{**base, **kw})


def test_the_vllm_engine_path_is_taken_on_cuda_collective_vllm_only():
    from rlpost.serving.weight_group import vllm_transfer_backend

    assert vllm_transfer.available()  # the installed vLLM has the engine
    assert vllm_transfer_backend(_rollout(), "cuda") == "nccl"
    assert vllm_transfer_backend(_rollout(weight_sync="auto"), "cuda") == "nccl"
    assert vllm_transfer_backend(_rollout(), "cpu") is None  # rlpost's own gloo group
    assert vllm_transfer_backend(_rollout(), "npu") is None  # HCCL: rlpost's own group
    assert vllm_transfer_backend(_rollout(weight_sync="ipc"), "cuda") is None
    assert vllm_transfer_backend(_rollout(weight_sync="object_store"), "cuda") is None
    assert vllm_transfer_backend(_rollout(name="sglang"), "cuda") is None
    assert vllm_transfer_backend(_rollout(pd=SimpleNamespace(enabled=True)), "cuda") is None


def test_the_engine_is_built_with_vllm_weight_transfer_config():
    from pathlib import Path

    from vllm.config.weight_transfer import WeightTransferConfig
    from vllm.engine.arg_utils import EngineArgs

    from rlpost.rollout.vllm.config import VLLMEngineConfig, engine_args

    model = Path(vllm_transfer.__file__).parents[1] / "rlpost/models/bases/tiny-812eaf54f30d"
    cfg = VLLMEngineConfig(model_path=str(model), kv_cache_gib=0.1, weight_transfer="nccl")
    args = EngineArgs(**engine_args(cfg, 0))
    assert isinstance(args.weight_transfer_config, WeightTransferConfig)
    assert args.weight_transfer_config.backend == "nccl"
    plain = engine_args(VLLMEngineConfig(model_path=str(model), kv_cache_gib=0.1), 0)
    assert "weight_transfer_config" not in plain


class StandInModel(torch.nn.Module):
    """Stands in for a vLLM model: parameters and a loader that writes what it is
    given and names what it wrote, as vLLM's models' ``load_weights`` do."""

    def __init__(self, head: bool):
        super().__init__()
        self.embed = torch.nn.Embedding(4, 2)
        if head:
            self.lm_head = torch.nn.Linear(2, 4, bias=False)
        self.loaded: list[list[str]] = []

    def load_weights(self, weights):
        weights = list(weights)
        self.loaded.append([n for n, _ in weights])
        params = dict(self.named_parameters())
        for name, tensor in weights:
            params[name].data.copy_(tensor)
        return {n for n, _ in weights}


def test_buckets_handed_to_the_loader_are_checked_like_a_reload():
    from rlpost.rollout.vllm.worker_ext import WeightSyncExtension

    ext = WeightSyncExtension()
    embed, head = ("embed.weight", torch.ones(4, 2)), ("lm_head.weight", torch.full((4, 2), 2.0))

    def transfer(model):  # as vLLM's packed consumer calls the loader: a list a bucket
        return lambda _: (model.load_weights([embed]), model.load_weights([head]))

    model = StandInModel(head=True)
    assert ext._rlpost_checked(model, None, transfer(model)) == ["embed.weight", "lm_head.weight"]
    assert model.lm_head.weight.eq(2).all() and "load_weights" not in vars(model)
    headless = StandInModel(head=False)  # a tied head with nowhere to go is dropped
    assert ext._rlpost_checked(headless, None, transfer(headless)) == ["embed.weight"]
    assert headless.loaded == [["embed.weight"], []]
    short = StandInModel(head=True)
    with pytest.raises(ValueError, match=r"left 1 rollout parameter\(s\) unwritten.*lm_head"):
        ext._rlpost_checked(short, None, lambda _: short.load_weights([embed]))
