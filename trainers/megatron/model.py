"""One rank's share of a megatron-core GPT model, with its optimizer: what the
Megatron policy and critic engines are built from.

Legend: b = samples, t = tokens, s = sequence (megatron's leading dim), h = hidden.

- **Model.** megatron-core's ``GPTModel`` with the local layer spec (no
  Transformer Engine), weights converted from the HF checkpoint by
  ``rlpost.trainers.megatron.convert``; on a machine without CUDA ``cpu_shim`` makes it
  run with gloo. A critic's output layer is a scalar value head instead of the
  vocabulary projection.
- **Steps.** The model is a backend of the shared update loop
  (``rlpost.trainers.update``). Every forward and backward goes through
  megatron's forward-backward schedule (1F1B across pipeline stages when
  ``pp > 1``); the micro-batch losses are summed, never averaged, and gradients
  are summed over data-parallel ranks, so with the loop's global normalisers
  the update does not depend on how the batch was split.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from rlpost.trainers.batch import TrajectoryBatch
from rlpost.trainers.distributed import Empty, gather_into, init_distributed, new_tensor
from rlpost.trainers.lr_schedule import lr_factor
from rlpost.trainers.megatron import cpu_shim, sequence_parallel
from rlpost.trainers.megatron.config import (
    MegatronEngineConfig,
    check_divisible,
    transformer_config,
)
from rlpost.trainers.megatron.context_parallel import ContextParallelAttention
from rlpost.trainers.megatron.convert import (
    hf_to_megatron,
    is_expert,
    part_of,
    parts,
    shape_from_hf,
    to_global,
    tp_full_shape,
    tp_layout,
    tp_pieces,
    tp_split,
    tp_views,
)
from rlpost.trainers.megatron.schedule import (
    R,
    StageOutput,
    all_keys,
    dp_batch,
    rows_from_last_stage,
    run_schedule,
)
from rlpost.trainers.micro_batching import micro_batches
from rlpost.trainers.update import OnOutput

if TYPE_CHECKING:
    from transformers import PreTrainedConfig


class ValueHead(torch.nn.Module):
    """Stands in for ``GPTModel.output_layer`` on a critic: hidden states (s, b, h) ->
    values (s, b, 1). Zero-initialised, as the FSDP critic's head; replicated on
    every tensor-parallel rank (the hidden states are whole there)."""

    def __init__(self, hidden: int, sequence_parallel: bool = False):
        super().__init__()
        self.value_head = torch.nn.Linear(hidden, 1)
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)
        self.sequence_parallel = sequence_parallel

    def forward(self, hidden_sbh: torch.Tensor, weight=None, runtime_gather_output=None):
        if self.sequence_parallel:  # this tp rank's tokens -> all of them
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            # every tp rank computes the same loss: the backward keeps its own
            # tokens' gradient rather than summing
            hidden_sbh = gather_from_sequence_parallel_region(
                hidden_sbh, tensor_parallel_output_grad=False
            )
        return self.value_head(hidden_sbh.float()), None


class MegatronModel:
    """Process groups, the model and the optimizer: a ``rlpost.trainers.update.Backend``.

    ``value_head``: the output layer is a ``ValueHead`` (a critic) rather than
    the vocabulary projection (a policy); the head's weights start at zero.
    """

    def __init__(
        self,
        cfg: MegatronEngineConfig,
        rank: int,
        world_size: int,
        init_method: str,
        value_head: bool = False,
    ):
        from megatron.core import parallel_state as mpu
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
        from transformers import AutoConfig

        cfg.check(world_size)
        cpu_shim.apply()
        torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        p = cfg.parallel
        self.device = init_distributed(cfg.device, cfg.backend, rank, world_size, init_method)
        mpu.initialize_model_parallel(
            tensor_model_parallel_size=p.tp,
            pipeline_model_parallel_size=p.pp,
            virtual_pipeline_model_parallel_size=p.vpp if p.vpp > 1 else None,
            context_parallel_size=p.cp,
            expert_model_parallel_size=p.ep,
        )
        model_parallel_cuda_manual_seed(cfg.seed)
        self.mpu = mpu
        self.hf_config = AutoConfig.from_pretrained(cfg.model_path)
        self.shape = shape_from_hf(self.hf_config)
        check_divisible(self.shape, p)
        self.tconfig = transformer_config(self.shape, p)
        self.first_stage = mpu.is_pipeline_first_stage()
        self.last_stage = mpu.is_pipeline_last_stage()
        self.value_head = value_head
        # One model chunk per virtual stage (one without vpp): with pp stages of vpp
        # chunks, this rank holds layer blocks v * pp + its stage for v < vpp.
        self.models = [self._build_chunk(v if p.vpp > 1 else None) for v in range(p.vpp)]
        for m in self.models:
            # built on the host (use_cpu_initialization); megatron's rotary tables,
            # plain attributes, follow the inputs' device at the first forward
            m.to(self.device)
        # each chunk's first layer and this rank's first expert, model-wide
        self.layer_offsets = [
            m.decoder.layers[0].layer_number - 1 if len(m.decoder.layers) else 0
            for m in self.models
        ]
        self.expert_offset = mpu.get_expert_model_parallel_rank() * (self.shape.experts // p.ep)
        self.load_hf_weights()
        self.num_params = _hf_num_params(self.hf_config, value_head)
        # megatron-core's DDP wrappers once an optimizer is built (no type information)
        self.chunks: list[Any] = list(self.models)
        self.optimizer: Any = None  # megatron-core's optimizer (no type information)
        self.steps = 0
        if cfg.trainable:
            self._build_optimizer()
        else:
            for m in self.models:
                m.requires_grad_(False)

    def _build_chunk(self, vp_stage: int | None) -> Any:
        """megatron-core's ``GPTModel`` for virtual stage ``vp_stage`` of this rank's
        pipeline stage (None: no virtual stages), with the local layer spec. Untyped:
        megatron-core ships no type information, and its modules are used by name."""
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

        p, mpu = self.cfg.parallel, self.mpu
        spec = get_gpt_layer_local_spec(
            num_experts=self.shape.experts or None,
            normalization="RMSNorm",
            qk_layernorm=self.shape.qk_norm,
        )
        if p.cp > 1:  # megatron's local attention refuses cp > 1
            spec.submodules.self_attention.submodules.core_attention = ContextParallelAttention
        block = spec  # the layer's spec, or (sequence parallelism) the block's submodules
        if p.sequence_parallel:  # megatron's local torch norms refuse it
            block = sequence_parallel.block_spec(spec, self.tconfig, vp_stage)
        stage = dict(ignore_virtual=vp_stage is None, vp_stage=vp_stage)
        post_process = mpu.is_pipeline_last_stage(**stage)
        model = GPTModel(
            self.tconfig,
            block,
            vocab_size=self.shape.vocab,
            max_sequence_length=self.shape.max_positions,
            pre_process=mpu.is_pipeline_first_stage(**stage),
            post_process=post_process,
            parallel_output=False,  # full-vocabulary logits on every tensor-parallel rank
            share_embeddings_and_output_weights=self.shape.tied and not self.value_head,
            position_embedding_type="rope",
            rotary_base=int(self.shape.rope_theta),
            vp_stage=vp_stage,
        )
        if self.value_head and post_process:
            model.output_layer = ValueHead(self.shape.hidden, p.sequence_parallel)
        return model

    # -- setup ---------------------------------------------------------------------
    def _build_optimizer(self) -> None:
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        c, p = self.cfg, self.cfg.parallel
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, use_distributed_optimizer=p.distributed_optimizer
        )
        self.chunks = [
            # later chunks in one bucket each, as megatron's own training does
            DistributedDataParallel(self.tconfig, ddp_config, m, disable_bucketing=i > 0)
            for i, m in enumerate(self.models)
        ]
        self.optimizer = get_megatron_optimizer(
            OptimizerConfig(
                optimizer="adam",
                lr=c.lr,
                weight_decay=c.weight_decay,
                adam_beta1=c.betas[0],
                adam_beta2=c.betas[1],
                adam_eps=1e-8,
                clip_grad=c.max_grad_norm,
                use_distributed_optimizer=p.distributed_optimizer,
            ),
            self.chunks,
            # {} rather than None: weight decay on every parameter, as the FSDP
            # engine's AdamW does (megatron's default spares biases and norms)
            config_overrides={},
        )

        def finalize(models, num_tokens=None, **kwargs):
            # data-parallel gradient sum, tied-embedding and sequence-parallel norm
            # reductions; no division by the token count, the loss is normalised already
            return finalize_model_grads(models, None, **kwargs)

        self.tconfig.finalize_model_grads_func = finalize

    def local_params(self) -> dict[str, torch.nn.Parameter]:
        """This rank's parameters under their model-wide Megatron names."""
        return {
            to_global(n, offset, self.expert_offset): p
            for model, offset in zip(self.models, self.layer_offsets)
            for n, p in model.named_parameters()
        }

    @torch.no_grad()
    def load_hf_weights(self) -> None:
        """This rank's shards of the HF checkpoint's weights (a value head keeps its zeros)."""
        from transformers import AutoModelForCausalLM

        from rlpost.runtime.hf_format import to_checkpoint_format

        hf_model = AutoModelForCausalLM.from_pretrained(self.cfg.model_path, dtype=torch.float32)
        full = hf_to_megatron(to_checkpoint_format(hf_model, hf_model.state_dict()), self.shape)
        if self.shape.tied:  # the last stage's copy of the embedding (pp > 1)
            full["output_layer.weight"] = full["embedding.word_embeddings.weight"]
        tp, tp_rank = self.cfg.parallel.tp, self.mpu.get_tensor_model_parallel_rank()
        for name, param in self.local_params().items():
            if self.value_head and name.startswith("output_layer."):
                continue
            shard = tp_split(name, full[name], tp)[tp_rank]
            if shard.shape != param.shape:
                raise ValueError(f"{name}: converted shape {tuple(shard.shape)} != {param.shape}")
            param.copy_(shard)

    # -- steps ------------------------------------------------------------------------
    def micro_batches(
        self, batch: TrajectoryBatch, micro_batch_size: int | None = None
    ) -> list[TrajectoryBatch]:
        """``batch`` in micro-batches of the engine's size (or ``micro_batch_size``
        samples). With virtual stages megatron's interleaved schedule runs the
        micro-batches in groups of pp, so their number is made a multiple of pp."""
        c, pp = self.cfg, self.cfg.parallel.pp
        if micro_batch_size is not None:
            mbs = micro_batches(batch, micro_batch_size)
        else:
            mbs = micro_batches(batch, c.micro_batch_size, c.micro_batch_tokens, c.packing)
        if c.parallel.vpp == 1 or len(mbs) % pp == 0:
            return mbs
        count = -(-len(mbs) // pp) * pp
        if len(batch) < count:
            raise ValueError(
                f"{len(batch)} samples per model copy: virtual pipeline stages need at least "
                f"pp={pp} (megatron's interleaved schedule runs micro-batches in groups of pp)"
            )
        bounds = [len(batch) * i // count for i in range(count + 1)]
        return [batch.select(slice(a, b)) for a, b in zip(bounds, bounds[1:])]

    def train(self) -> None:
        for chunk in self.chunks:
            chunk.train()

    def eval(self) -> None:
        for chunk in self.chunks:
            chunk.eval()

    def run(self, mbs: list[TrajectoryBatch], on_output: StageOutput[R]) -> list[R]:
        """``run_schedule`` of this model over ``mbs``."""
        c = self.cfg
        return run_schedule(
            self.chunks,
            mbs,
            on_output,
            c.packing,
            self.mpu,
            self.device,
            c.parallel.sequence_parallel,
        )

    @property
    def trainable(self) -> bool:
        return self.optimizer is not None

    @property
    def reports_metrics(self) -> bool:
        """Each data-parallel batch's sums live on its last stage, once per tensor- and
        context-parallel rank: rank 0 of those reports them."""
        mpu = self.mpu
        return (
            self.last_stage
            and mpu.get_tensor_model_parallel_rank() == 0
            and mpu.get_context_parallel_rank() == 0
        )

    @cpu_shim.runs_on_cpu
    def forward(self, batch: TrajectoryBatch, on_output: OnOutput, *, grad: bool) -> torch.Tensor:
        """The model-parallel group's data-parallel batch through the schedule;
        ``on_output`` runs on the last stage, and the rows it hands back reach every
        stage, this rank's rows returned. Collective."""
        if grad:
            self.train()
        else:
            self.eval()
        data, mine = dp_batch(batch, self.mpu)
        mbs = self.micro_batches(data)
        with torch.set_grad_enabled(grad):
            results = self.run(mbs, on_output)
        shape = data.input_ids_bt.shape
        return rows_from_last_stage(mbs, results, shape, self.mpu, self.cfg.parallel.pp)[mine]

    @cpu_shim.runs_on_cpu
    def zero_grad(self) -> None:
        for chunk in self.chunks:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()

    def metric_keys(self, keys: list[str]) -> list[str]:
        return all_keys(keys)  # ranks off the last stage have none

    def lr(self) -> float:
        """The FSDP engine's schedule (``rlpost.trainers.lr_schedule``) at this step."""
        c = self.cfg
        return c.lr * lr_factor(
            self.steps, c.lr_warmup_steps, c.lr_schedule, c.lr_decay_steps, c.lr_min_ratio
        )

    @cpu_shim.runs_on_cpu
    def optimizer_step(self) -> tuple[float, float, bool]:
        """Clip and step unless the global gradient norm is NaN or Inf (then skip, on
        every rank alike: the norm is the same everywhere). Returns the gradient norm,
        the LR schedule's value after the step, and whether it skipped."""
        from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

        opt = self.optimizer
        lr = self.lr()
        for group in opt.param_groups:
            group["lr"] = lr
        opt.prepare_grads()
        grad_norm = float(opt.get_grad_norm())
        if not math.isfinite(grad_norm):
            opt.zero_grad()
            return grad_norm, self.lr(), True
        for sub in getattr(opt, "chained_optimizers", [opt]):
            params = sub.get_parameters()
            if params and self.cfg.max_grad_norm > 0:
                clip_grad_by_total_norm_fp32(params, self.cfg.max_grad_norm, grad_norm)
        opt.step_with_ready_grads()
        self.steps += 1
        return grad_norm, self.lr(), False

    # -- weights ------------------------------------------------------------------------
    @torch.no_grad()
    def gathered_state(
        self, value: Callable[[torch.nn.Parameter], torch.Tensor] = lambda p: p.detach()
    ) -> dict[str, torch.Tensor] | None:
        """Full Megatron tensors of ``value(param)`` (the weights; the tests also read
        gradients) on global rank 0, None elsewhere. Collective.

        Tensor-parallel shards are all-gathered within each stage, then the first
        data-parallel replica's stages send their layers to rank 0.
        """
        return self._gathered(self._shared_params().items(), value)

    @torch.no_grad()
    def gathered_parts(
        self, empty: Empty = new_tensor
    ) -> Iterator[tuple[int | str, dict[str, torch.Tensor] | None]]:
        """``gathered_state`` one part at a time (``convert.part_of``: the embedding,
        each decoder layer, the head), so rank 0 holds one part beyond its shards:
        ``(part, its full tensors)`` on global rank 0, ``(part, None)`` elsewhere.
        ``empty(shape, dtype, device)``: the memory each full tensor is put in.
        Collective: every rank runs the iterator to its end."""
        params = self._shared_params()
        for part in parts(self.shape):
            mine = ((n, p) for n, p in params.items() if part_of(n) == part)
            yield part, self._gathered(mine, lambda p: p.detach(), empty)

    def _shared_params(self) -> dict[str, torch.nn.Parameter]:
        """``local_params`` less the last stage's copy of a tied embedding."""
        tied_copy = self.shape.tied and not self.value_head
        return {
            n: p
            for n, p in self.local_params().items()
            if not (tied_copy and n == "output_layer.weight")
        }

    def _gathered(
        self,
        params: Iterable[tuple[str, torch.nn.Parameter]],
        value: Callable[[torch.nn.Parameter], torch.Tensor],
        empty: Empty = new_tensor,
    ) -> dict[str, torch.Tensor] | None:
        """The full tensors of ``value(param)`` for ``params`` (this rank's, the same
        names on every rank of its stage) on global rank 0, each in new memory from
        ``empty``. Collective.

        Tensor-parallel shards are gathered within each stage straight into their
        full tensor (``gather_into``: no list of shards joined afterwards), then the
        first data-parallel replica's stages send theirs to rank 0.
        """
        mpu = self.mpu
        tp_group = mpu.get_tensor_model_parallel_group()
        tp = self.cfg.parallel.tp
        state: dict[str, torch.Tensor] = {}
        for name, param in params:
            local = value(param)
            split = tp > 1 and tp_layout(name) != "rep"
            shape = tp_full_shape(name, tuple(local.shape), tp) if split else tuple(local.shape)
            full = empty(shape, local.dtype, local.device)
            if split:
                pieces = tp_pieces(name, local)
                gather_into(tp_views(name, full, tp), pieces, tp_group)
            else:  # the parameter itself: a copy, which training does not change
                full.copy_(local)
            state[name] = full
        if self.cfg.parallel.ep > 1:  # every expert-parallel rank's experts
            shares: list[Any] = [None] * self.cfg.parallel.ep  # all_gather_object fills them
            experts = {k: v for k, v in state.items() if is_expert(k)}
            dist.all_gather_object(shares, experts, group=mpu.get_expert_model_parallel_group())
            state.update({k: v for share in shares for k, v in share.items()})
        if (
            mpu.get_data_parallel_rank() != 0
            or mpu.get_tensor_model_parallel_rank() != 0
            or mpu.get_context_parallel_rank() != 0
        ):
            return None
        if self.cfg.parallel.pp > 1:
            group = mpu.get_pipeline_model_parallel_group()
            # placeholders gather_object fills on rank 0
            parts: list[Any] | None = [None] * self.cfg.parallel.pp if self.rank == 0 else None
            dist.gather_object(state, parts, dst=0, group=group)
            if self.rank != 0:
                return None
            assert parts is not None
            state = {k: v for part in parts for k, v in part.items()}
        return state if self.rank == 0 else None

    def close(self) -> None:
        if self.mpu.model_parallel_is_initialized():
            self.mpu.destroy_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()


def _hf_num_params(config: PreTrainedConfig, value_head: bool) -> int:
    """The HF model's parameter count: the causal LM's, or the body's and a value head's."""
    from transformers import AutoModel, AutoModelForCausalLM

    with torch.device("meta"):
        if value_head:
            body = AutoModel.from_config(config)
            return sum(p.numel() for p in body.parameters()) + config.hidden_size + 1
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())
