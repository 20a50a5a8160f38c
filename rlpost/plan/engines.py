"""The engines' configs -- the rollout engine's and each trainer group's -- derived
from the run config in this one place."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from rlpost.algos.spec import narrow
from rlpost.config.groups import Config
from rlpost.device import DeviceSpec, resolve_device
from rlpost.workers.placement import cpu_threads

if TYPE_CHECKING:
    from rlpost.rollout.hf import HFEngineConfig
    from rlpost.rollout.pd import PDEngineConfig
    from rlpost.rollout.sglang.engine import SGLangEngineConfig
    from rlpost.rollout.sglang.pd import SGLangPDConfig
    from rlpost.rollout.vllm import VLLMEngineConfig
    from rlpost.trainers.engine_config import EngineConfig
    from rlpost.trainers.fsdp import FSDPEngineConfig
    from rlpost.trainers.megatron.config import MegatronEngineConfig

    RolloutEngineConfig = (
        HFEngineConfig | SGLangPDConfig | SGLangEngineConfig | VLLMEngineConfig | PDEngineConfig
    )

FROZEN_ROLES = ("reference", "teacher")  # trainer groups that only compute log-probs
E = TypeVar("E", bound="EngineConfig")


def rollout_engine_config(cfg: Config, model_path: str, device_kind: str) -> RolloutEngineConfig:
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
    from rlpost.serving.weight_group import bucket_bytes, vllm_transfer_backend

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
        sleep_mode=sleeps(cfg, device_kind),
        weight_transfer=vllm_transfer_backend(r, device_kind),
        weight_transfer_bucket_bytes=bucket_bytes(r.weight_sync_bucket_mb),
    )
    if not r.pd.enabled:
        return base
    from rlpost.rollout.pd import pd_engine_config

    return pd_engine_config(
        base, r.pd.prefill_replicas, r.pd.decode_replicas, r.pd.connector, r.pd.shared_dir
    )


def engine_config(
    cls: type[E],
    cfg: Config,
    model_path: str,
    lr: float,
    lr_warmup_steps: int,
    trainable: bool,
    device: DeviceSpec | None = None,
    **own: Any,
) -> E:
    """A training engine's config: the fields every engine shares
    (``rlpost.trainers.engine_config.EngineConfig``), from the run config, and
    ``own``, the fields of that engine's config alone."""
    t = cfg.trainer
    device = device or resolve_device(t.device)
    return cls(
        model_path=model_path,
        dtype=cfg.model.dtype,
        lr=lr,
        weight_decay=t.weight_decay,
        betas=(t.betas[0], t.betas[1]),
        max_grad_norm=t.max_grad_norm,
        micro_batch_size=t.micro_batch_size,
        seed=t.seed,
        device=device.kind,
        backend=device.backend,
        threads=cpu_threads(cfg, device.kind),
        lr_warmup_steps=lr_warmup_steps,
        lr_schedule=t.lr_schedule,
        lr_decay_steps=t.total_steps * cfg.algo.epochs * cfg.algo.mini_batches,
        lr_min_ratio=t.lr_min_ratio,
        trainable=trainable,
        micro_batch_tokens=t.micro_batch_tokens,
        **own,
    )


def megatron_engine_config(
    cfg: Config,
    model_path: str,
    lr: float,
    lr_warmup_steps: int,
    trainable: bool,
    packing: bool = True,
    device: DeviceSpec | None = None,
) -> MegatronEngineConfig:
    """The Megatron engines' settings for ``trainer=megatron`` (policy, reference and
    critic; the critic runs padded, ``packing=False``)."""
    from rlpost.trainers.megatron.config import MegatronEngineConfig, MegatronParallel

    return engine_config(
        MegatronEngineConfig,
        cfg,
        model_path,
        lr,
        lr_warmup_steps,
        trainable,
        device,
        packing=cfg.trainer.packing and packing,
        parallel=narrow(cfg.trainer.megatron, MegatronParallel),
    )


def trainer_engine_config(
    cfg: Config,
    role: str,
    model_path: str,
    device: DeviceSpec,
    lr: float | None = None,
    lr_warmup_steps: int | None = None,
) -> FSDPEngineConfig | MegatronEngineConfig:
    """The engine config of trainer group ``role`` (policy, reference, teacher or
    critic): the reference and ``algo=opd``'s teacher are frozen policies, the critic
    has its own learning rate and runs padded. ``lr`` and ``lr_warmup_steps``
    override the role's (the warm-up's)."""
    from rlpost.trainers.fsdp import FSDPEngineConfig, LoraSettings

    t, m = cfg.trainer, cfg.model
    kind = "critic" if role == "critic" else "policy"
    trainable = role not in FROZEN_ROLES
    if lr is None:
        lr = t.critic_lr if role == "critic" else t.lr
    if lr_warmup_steps is None:
        lr_warmup_steps = 0 if role in FROZEN_ROLES else t.lr_warmup_steps
    if t.name == "megatron":
        return megatron_engine_config(
            cfg, model_path, lr, lr_warmup_steps, trainable, kind == "policy", device
        )
    return engine_config(
        FSDPEngineConfig,
        cfg,
        model_path,
        lr,
        lr_warmup_steps,
        trainable,
        device,
        lora=m.lora if role == "policy" else LoraSettings(),
        gradient_checkpointing=m.gradient_checkpointing,
        param_offload=m.param_offload,
        optimizer_offload=m.optimizer_offload,
        packing=t.packing and kind == "policy",
        prefix_sharing=t.prefix_sharing,
        freeze_vision=m.freeze_vision,
        mixed_precision=t.mixed_precision,
        ulysses=t.ulysses,
        compile=t.compile,
    )


def sleeps(cfg: Config, device_kind: str) -> bool:
    """What ``rollout.sleep`` means for this run: ``auto`` is on for a colocated
    placement on an accelerator with vLLM, in sync mode."""
    r = cfg.rollout
    if r.sleep != "auto":
        return bool(r.sleep == "on")
    return (
        device_kind != "cpu"
        and cfg.trainer.placement == "colocated"
        and r.name == "vllm"
        and cfg.trainer.async_mode == "sync"
    )
