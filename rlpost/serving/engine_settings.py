"""The rollout engine's config, derived from the run config in this one place."""

from __future__ import annotations

from typing import Any


def engine_config(cfg: Any, model_path: str, device_kind: str) -> Any:
    """The engine config for ``cfg.rollout.name`` from the run config."""
    r = cfg.rollout
    if r.name == "hf":
        from rlpost.rollout.hf import HFEngineConfig

        return HFEngineConfig(
            model_path=model_path,
            dtype=r.dtype,
            max_model_len=r.max_model_len,
            seed=cfg.trainer.seed,
            device=device_kind,
        )
    if r.name == "sglang" and r.pd.enabled:
        from rlpost.rollout.sglang.pd import SGLangPDConfig

        return SGLangPDConfig(
            model_path=model_path,
            prefill_replicas=r.pd.prefill_replicas,
            decode_replicas=r.pd.decode_replicas,
            transfer_backend=r.pd.transfer_backend,
            dtype=r.dtype,
            max_model_len=r.max_model_len,
            mem_fraction_static=r.gpu_memory_utilization,
            seed=cfg.trainer.seed,
        )
    if r.name == "sglang":
        from rlpost.rollout.sglang.engine import SGLangEngineConfig

        return SGLangEngineConfig(
            model_path=model_path,
            dtype=r.dtype,
            max_model_len=r.max_model_len,
            mem_fraction_static=r.gpu_memory_utilization,
            seed=cfg.trainer.seed,
        )
    from rlpost.rollout.vllm import VLLMEngineConfig

    base = VLLMEngineConfig(
        model_path=model_path,
        dtype=r.dtype,
        max_model_len=r.max_model_len,
        kv_cache_gib=r.kv_cache_gib,
        gpu_memory_utilization=r.gpu_memory_utilization,
        enforce_eager=r.enforce_eager,
        seed=cfg.trainer.seed,
        device=device_kind,
        block_size=r.block_size,
        cpu_threads_bind=str(r.cpu_threads_bind),
        lora=cfg.model.lora.rank if r.lora_sync == "adapter" else 0,
        max_images=r.max_images,
    )
    if not r.pd.enabled:
        return base
    from rlpost.rollout.pd import pd_engine_config

    return pd_engine_config(
        base, r.pd.prefill_replicas, r.pd.decode_replicas, r.pd.connector, r.pd.shared_dir
    )
