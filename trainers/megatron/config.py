"""The Megatron engines' settings: how the model is split over ranks, and the
megatron-core ``TransformerConfig`` built from the HF model's shape and that split."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from rlpost.algos.spec import check as check_settings
from rlpost.algos.spec import spec
from rlpost.trainers.engine_config import EngineConfig

if TYPE_CHECKING:  # the run config's schema imports this module: no torch at start-up
    from rlpost.trainers.megatron.convert import ModelShape


@dataclass(frozen=True)
class MegatronParallel:
    """How the model is split over ranks; data parallelism takes the rest of the world.
    The run config's ``trainer.megatron`` is this, with its data-parallel size
    (``rlpost.config.groups.MegatronConfig``)."""

    tp: int = spec(1, ge=1, help="tensor parallel: each layer's matrices split over tp ranks")
    pp: int = spec(1, ge=1, help="pipeline parallel: the layers split into pp stages (1F1B)")
    vpp: int = spec(
        1,
        ge=1,
        help="virtual pipeline stages per rank (interleaved 1F1B; pp > 1, layers divide by pp x vpp)",
    )
    cp: int = spec(
        1, ge=1, help="context parallel: each sequence split over cp ranks (any backend)"
    )
    ep: int = spec(
        1, ge=1, help="expert parallel (Qwen3-MoE): the experts split over ep data-parallel ranks"
    )
    sequence_parallel: bool = spec(
        False,
        help="split activations outside attention/MLP over tp ranks (needs tp > 1; MoE with tp > 1 needs it)",
    )
    distributed_optimizer: bool = spec(
        False, help="shard the optimizer state over data-parallel ranks (ZeRO-1)"
    )
    recompute: Literal["none", "selective", "full"] = spec(
        "none", help="activation recomputation: selective (core attention) or full (each layer)"
    )

    def __post_init__(self) -> None:
        check_settings(self)

    def check(self, world_size: int) -> None:
        """Raise on a layout this engine cannot run, saying what to change."""
        model_parallel = self.tp * self.pp * self.cp
        if world_size % model_parallel:
            raise ValueError(
                f"world size {world_size} does not divide by tp x pp x cp = {model_parallel}"
            )
        if world_size % (self.tp * self.pp * self.ep):
            raise ValueError(
                f"world size {world_size} does not divide by tp x pp x ep = "
                f"{self.tp * self.pp * self.ep} (expert-parallel ranks are data-parallel ranks)"
            )
        if self.vpp > 1 and self.pp == 1:
            raise ValueError("vpp > 1 (virtual pipeline stages) needs pp > 1")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel needs tp > 1")
        if self.recompute not in ("none", "selective", "full"):
            raise ValueError(f"recompute={self.recompute!r}: expected none, selective or full")


@dataclass(frozen=True)
class MegatronEngineConfig(EngineConfig):
    trainer: ClassVar[str] = "megatron"

    parallel: MegatronParallel = field(default_factory=MegatronParallel)

    def check(self, world_size: int) -> None:
        if self.packing and self.parallel.vpp > 1:
            raise ValueError(
                "packing with vpp > 1: interleaved stages need one shape for every micro-batch"
            )
        if self.dtype != "float32":
            raise NotImplementedError(
                f"dtype={self.dtype}: the Megatron engine trains in float32 for now"
            )
        self.parallel.check(world_size)


def check_divisible(s: ModelShape, p: MegatronParallel) -> None:
    """Raise if the model's shape does not split over ``p``'s ranks."""
    problems = []
    if s.heads % p.tp or s.kv_heads % p.tp:
        problems.append(
            f"attention heads ({s.heads}) and key/value heads ({s.kv_heads}) must divide by tp"
        )
    if s.vocab % p.tp:
        problems.append(f"the vocabulary ({s.vocab}) must divide by tp")
    if s.ffn % p.tp:
        problems.append(f"the MLP width ({s.ffn}) must divide by tp")
    if s.num_layers % (p.pp * p.vpp):
        problems.append(f"the layers ({s.num_layers}) must divide by pp x vpp")
    if p.ep > 1 and not s.experts:
        problems.append("ep > 1 needs an MoE model; this one is dense")
    elif s.experts % p.ep:
        problems.append(f"the experts ({s.experts}) must divide by ep")
    if s.experts and p.tp > 1 and not p.sequence_parallel:
        # megatron-core's MoELayer: "During training, performance may degrade if MoE and
        # tensor parallelism are enabled without also enabling sequence parallelism"
        problems.append(
            "an MoE model with tp > 1 needs sequence_parallel=true (megatron-core refuses "
            "MoE with tensor parallelism alone)"
        )
    if problems:
        raise ValueError(f"tp={p.tp}, pp={p.pp}, ep={p.ep}: " + "; ".join(problems))


def transformer_config(s: ModelShape, p: MegatronParallel):
    """megatron-core's ``TransformerConfig`` for a model of shape ``s`` split as ``p``:
    float32, no dropout, unfused (CPU-capable) kernels."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    moe: dict[str, Any] = {}
    if s.experts:
        moe = dict(
            num_moe_experts=s.experts,
            moe_router_topk=s.top_k,
            moe_ffn_hidden_size=s.moe_ffn,
            # HF Qwen3-MoE: softmax over every expert, then the top k; renormalised
            # (norm_topk_prob) that equals megatron's softmax over the top k logits
            moe_router_pre_softmax=not s.norm_topk,
            moe_router_load_balancing_type="none",  # no auxiliary loss: the HF forward has none
            moe_aux_loss_coeff=0.0,
            moe_grouped_gemm=False,  # one plain MLP per expert (grouped GEMM is CUDA)
            moe_permute_fusion=False,
            expert_model_parallel_size=p.ep,
        )
    recompute: dict[str, Any] = {}
    if p.recompute == "selective":
        recompute = dict(recompute_granularity="selective")
    elif p.recompute == "full":
        recompute = dict(
            recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1
        )
    return TransformerConfig(
        num_layers=s.num_layers,
        hidden_size=s.hidden,
        num_attention_heads=s.heads,
        num_query_groups=s.kv_heads,
        kv_channels=s.head_dim,
        ffn_hidden_size=s.ffn,
        normalization="RMSNorm",
        layernorm_epsilon=s.eps,
        qk_layernorm=s.qk_norm,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=s.qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=torch.float32,
        pipeline_dtype=torch.float32,
        use_cpu_initialization=True,
        # unfused paths only: the fused kernels are CUDA (Apex, Transformer Engine)
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        tensor_model_parallel_size=p.tp,
        pipeline_model_parallel_size=p.pp,
        virtual_pipeline_model_parallel_size=p.vpp if p.vpp > 1 else None,
        context_parallel_size=p.cp,
        sequence_parallel=p.sequence_parallel,
        # micro-batches differ in rows and length; pipeline stages send shapes first
        # (interleaved stages: every micro-batch is padded to one shape, see schedule.py)
        variable_seq_lengths=p.pp > 1 and p.vpp == 1,
        # Batched p2p posts each rank's sends and receives as [prev, next]; at pp = 2
        # both neighbours are one rank, so an interleaved step's gradient to it can
        # meet the receive meant for its activation. Unbatched, megatron pairs them.
        batch_p2p_comm=p.vpp == 1,
        moe_token_dispatcher_type="alltoall",  # the default refuses variable_seq_lengths
        # each micro-batch loss is already its share of the global loss: summed as it is
        calculate_per_token_loss=True,
        **moe,
        **recompute,
    )
