"""Megatron-core policy engine: log-probs, policy/SFT updates, HF-named weight export,
with tensor (``tp``) and pipeline (``pp``) parallelism and data parallelism over the
remaining ranks.

Legend: b = samples, t = tokens, v = vocab.

The engine has ``FSDPEngine``'s interface, so the worker shells and the
controller drive either one alike. What differs inside:

- **Data.** The worker group hands every rank an equal share of the batch, as
  for FSDP. The ranks of one model-parallel group (tp x pp ranks that hold one
  copy of the model between them) must all see the same samples, so each
  engine call first gathers its group's shares into one data-parallel batch,
  and each rank returns the rows it was given.
- **Model.** megatron-core's ``GPTModel`` with the local layer spec (no
  Transformer Engine), weights converted from the HF checkpoint by
  ``trainers.megatron.convert``; on a machine without CUDA ``cpu_shim`` makes
  it run with gloo.
- **Steps.** Every forward and backward goes through megatron's
  forward-backward schedule (1F1B across pipeline stages when ``pp > 1``). Loss
  normalisers are global counts, as in the FSDP engine; the micro-batch losses
  are summed, never averaged, and gradients are summed over data-parallel
  ranks, so the update does not depend on how the batch was split.
- **Losses** are ``trainers.objectives`` (the ``algos`` functions), the same
  as the FSDP engine's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from algos import LossNorm, PolicyLossConfig, entropy_from_logits, sft_loss
from trainers.batch import TrajectoryBatch
from trainers.engine_config import EngineConfig
from trainers.files import atomic_directory, safe_torch_load
from trainers.fsdp.common import (
    SUMMED_METRICS,
    global_metrics,
    global_norm,
    init_distributed,
    micro_batches,
    pack,
    run_epochs,
    unpack,
)
from trainers.fsdp.engine import RegularizerConfig, token_logprobs
from trainers.megatron import cpu_shim
from trainers.megatron.convert import (
    ModelShape,
    hf_to_megatron,
    megatron_to_hf,
    shape_from_hf,
    to_global,
    tp_layout,
    tp_merge,
    tp_split,
)
from trainers.objectives import check_policy_batch, policy_objective

# megatron-core's local layer spec normalises with torch's norms, which refuse
# sequence parallelism ("sequence parallel not supported by torch LayerNorm"); it
# needs Transformer Engine's or Apex's, CUDA builds.
SEQUENCE_PARALLEL_MISSING = (
    "sequence_parallel needs Transformer Engine or Apex layer norms (CUDA); the engine "
    "builds megatron-core's local layer spec, whose torch norms refuse it"
)

# What one micro-batch's loss function returns: its share of the global loss and metrics.
MicroLoss = Callable[
    [TrajectoryBatch, torch.Tensor, torch.Tensor | None, LossNorm],
    tuple[torch.Tensor, dict[str, float]],
]


@dataclass(frozen=True)
class MegatronParallel:
    """How the model is split over ranks; data parallelism takes the rest of the world."""

    tp: int = 1  # tensor parallel: each layer's matrices split over tp ranks
    pp: int = 1  # pipeline parallel: the layers split into pp stages
    vpp: int = 1  # virtual pipeline stages per rank (interleaved 1F1B)
    cp: int = 1  # context parallel: the sequence split over cp ranks
    ep: int = 1  # expert parallel (MoE models)
    sequence_parallel: bool = False  # activations outside attention/MLP split over tp ranks
    distributed_optimizer: bool = False  # optimizer state sharded over data-parallel ranks
    recompute: str = "none"  # none | selective (core attention) | full (whole layers)

    def check(self, world_size: int) -> None:
        """Raise on a layout this engine cannot run, saying what to change."""
        model_parallel = self.tp * self.pp * self.cp
        if world_size % model_parallel:
            raise ValueError(
                f"world size {world_size} does not divide by tp x pp x cp = {model_parallel}"
            )
        if self.vpp != 1 or self.cp != 1 or self.ep != 1:
            raise NotImplementedError(
                "the Megatron engine runs tp, pp and data parallelism; vpp, cp and ep must be 1"
            )
        if self.sequence_parallel:
            raise NotImplementedError(SEQUENCE_PARALLEL_MISSING)
        if self.recompute not in ("none", "selective", "full"):
            raise ValueError(f"recompute={self.recompute!r}: expected none, selective or full")


@dataclass(frozen=True)
class MegatronEngineConfig(EngineConfig):
    parallel: MegatronParallel = field(default_factory=MegatronParallel)

    def check(self, world_size: int) -> None:
        if self.dtype != "float32":
            raise NotImplementedError(
                f"dtype={self.dtype}: the Megatron engine trains in float32 for now"
            )
        self.parallel.check(world_size)


def _transformer_config(s: ModelShape, p: MegatronParallel):
    from megatron.core.transformer import TransformerConfig

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
        sequence_parallel=p.sequence_parallel,
        # micro-batches differ in rows and length; pipeline stages send shapes first
        variable_seq_lengths=p.pp > 1,
        moe_token_dispatcher_type="alltoall",  # the default refuses variable_seq_lengths
        # each micro-batch loss is already its share of the global loss: summed as it is
        calculate_per_token_loss=True,
        **recompute,
    )


class MegatronEngine:
    @cpu_shim.runs_on_cpu
    def __init__(self, cfg: MegatronEngineConfig, rank: int, world_size: int, init_method: str):
        from megatron.core import parallel_state as mpu
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
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
            tensor_model_parallel_size=p.tp, pipeline_model_parallel_size=p.pp
        )
        model_parallel_cuda_manual_seed(cfg.seed)
        self.mpu = mpu
        self.hf_config = AutoConfig.from_pretrained(cfg.model_path)
        self.shape = shape_from_hf(self.hf_config)
        check_divisible(self.shape, p)
        self.tconfig = _transformer_config(self.shape, p)
        self.first_stage = mpu.is_pipeline_first_stage()
        self.last_stage = mpu.is_pipeline_last_stage()
        model = GPTModel(
            self.tconfig,
            get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=self.shape.qk_norm),
            vocab_size=self.shape.vocab,
            max_sequence_length=self.shape.max_positions,
            pre_process=self.first_stage,
            post_process=self.last_stage,
            parallel_output=False,  # full-vocabulary logits on every tensor-parallel rank
            share_embeddings_and_output_weights=self.shape.tied,
            position_embedding_type="rope",
            rotary_base=int(self.shape.rope_theta),
        )
        layers = model.decoder.layers
        self.layer_offset = layers[0].layer_number - 1 if len(layers) else 0
        self.model = model
        self._load_hf_weights()
        self.num_params = _hf_num_params(self.hf_config)
        self.chunk: Any = model  # the DDP wrapper once an optimizer is built
        self.optimizer: Any = None
        self.steps = 0
        if cfg.trainable:
            self._build_optimizer()
        else:
            model.requires_grad_(False)

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
        self.chunk = DistributedDataParallel(self.tconfig, ddp_config, self.model)
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
            [self.chunk],
            # {} rather than None: weight decay on every parameter, as the FSDP
            # engine's AdamW does (megatron's default spares biases and norms)
            config_overrides={},
        )

        def finalize(models, num_tokens=None, **kwargs):
            # data-parallel gradient sum, tied-embedding and sequence-parallel norm
            # reductions; no division by the token count, the loss is normalised already
            return finalize_model_grads(models, None, **kwargs)

        self.tconfig.finalize_model_grads_func = finalize

    def _local_params(self) -> dict[str, torch.nn.Parameter]:
        """This rank's parameters under their model-wide Megatron names."""
        return {to_global(n, self.layer_offset): p for n, p in self.model.named_parameters()}

    @torch.no_grad()
    def _load_hf_weights(self, hf_state: dict[str, torch.Tensor] | None = None) -> None:
        if hf_state is None:
            from transformers import AutoModelForCausalLM

            from trainers.hf_format import to_checkpoint_format

            hf_model = AutoModelForCausalLM.from_pretrained(
                self.cfg.model_path, dtype=torch.float32
            )
            hf_state = to_checkpoint_format(hf_model, hf_model.state_dict())
        full = hf_to_megatron(hf_state, self.shape)
        if self.shape.tied:  # the last stage's copy of the embedding (pp > 1)
            full["output_layer.weight"] = full["embedding.word_embeddings.weight"]
        tp, tp_rank = self.cfg.parallel.tp, self.mpu.get_tensor_model_parallel_rank()
        for name, param in self._local_params().items():
            shard = tp_split(name, full[name], tp)[tp_rank]
            if shard.shape != param.shape:
                raise ValueError(f"{name}: converted shape {tuple(shard.shape)} != {param.shape}")
            param.copy_(shard)

    # -- data ------------------------------------------------------------------------
    def _dp_batch(self, batch: TrajectoryBatch) -> tuple[TrajectoryBatch, slice]:
        """The model-parallel group's shares joined into one batch, and this rank's rows."""
        group = self.mpu.get_model_parallel_group()
        size = dist.get_world_size(group)
        if size == 1:
            return batch, slice(0, len(batch))
        shares: list[Any] = [None] * size
        dist.all_gather_object(shares, batch, group=group)
        me = dist.get_rank(group)
        start = sum(len(s) for s in shares[:me])
        width = max(s.input_ids_bt.shape[1] for s in shares)
        joined = _concat([_pad_width(s, width) for s in shares])
        return joined, slice(start, start + len(batch))

    def _micro_batches(self, batch: TrajectoryBatch) -> list[TrajectoryBatch]:
        c = self.cfg
        return micro_batches(batch, c.micro_batch_size, c.micro_batch_tokens, c.packing)

    def _inputs(self, mb: TrajectoryBatch) -> tuple[torch.Tensor, ...]:
        """Token ids, positions and the boolean attention mask (True: masked) of ``mb``.

        Padded rows use one causal mask; right padding only follows real tokens,
        so real tokens never see it. A packed row's mask is block-diagonal:
        causal within a sample, nothing across samples.
        """
        if self.cfg.packing:
            ids_1T, pos_1T, lengths = pack(mb)
            sample_T = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
            same_TT = sample_T[:, None] == sample_T[None, :]
            causal_TT = torch.ones_like(same_TT).tril()
            return ids_1T, pos_1T, ~(same_TT & causal_TT)[None, None]
        b, t = mb.input_ids_bt.shape
        pos_bt = torch.arange(t).expand(b, t)
        mask_11tt = torch.ones(t, t, dtype=torch.bool).triu(1)[None, None]
        return mb.input_ids_bt, pos_bt, mask_11tt

    def _token_stats(
        self, mb: TrajectoryBatch, logits: torch.Tensor, temperature: float, entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (b, t) and, if asked, entropies (b, t) from the model's logits."""
        logits = logits.float() / temperature
        width = mb.input_ids_bt.shape[1]
        ids = pack(mb)[0] if self.cfg.packing else mb.input_ids_bt
        logp = token_logprobs(logits, ids)
        ent = F.pad(entropy_from_logits(logits[:, :-1]), (1, 0)) if entropy else None
        if self.cfg.packing:
            lengths = [int(n) for n in mb.attention_mask_bt.sum(dim=1).tolist()]
            logp = unpack(logp, lengths, width)
            ent = unpack(ent, lengths, width) if ent is not None else None
        return logp, ent

    # -- the schedule -----------------------------------------------------------------
    def _run(
        self, mbs: list[TrajectoryBatch], on_logits: Callable[[TrajectoryBatch, torch.Tensor], Any]
    ) -> list[Any]:
        """Forward (and, with grad enabled, backward) over ``mbs`` through megatron's
        schedule; returns ``on_logits``'s results on the last pipeline stage.

        ``on_logits(mb, logits_btv)`` returns ``(loss, result)``; the losses are
        summed (their gradient is what the step applies).
        """
        from megatron.core.pipeline_parallel import get_forward_backward_func

        def forward_step(data, model):
            mb = next(data)
            ids, pos, mask = self._inputs(mb)
            out = model(ids, pos, attention_mask=mask)

            def loss_func(logits):
                loss, result = on_logits(mb, logits)
                return loss, torch.tensor(0, dtype=torch.int), result

            return out, loss_func

        forward_only = not torch.is_grad_enabled()
        widths = [mb.input_ids_bt.shape[1] for mb in mbs]
        return get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(mbs),
            model=[self.chunk],
            num_microbatches=len(mbs),
            seq_length=max(widths),
            micro_batch_size=max(len(mb) for mb in mbs),
            forward_only=forward_only,
        )

    def _from_last_stage(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` as the last pipeline stage has it, on every stage."""
        if self.cfg.parallel.pp == 1:
            return tensor
        src = self.mpu.get_pipeline_model_parallel_last_rank()
        dist.broadcast(tensor, src, group=self.mpu.get_pipeline_model_parallel_group())
        return tensor

    # -- forward passes -----------------------------------------------------------------
    @cpu_shim.runs_on_cpu
    @torch.no_grad()
    def logprobs(
        self, batch: TrajectoryBatch, temperature: float = 1.0, disable_adapter: bool = False
    ) -> torch.Tensor:
        """Log-probs (b, t) of this rank's batch under the current weights (0 off the response)."""
        if disable_adapter:
            raise ValueError("disable_adapter=True: the Megatron engine has no LoRA")
        self.chunk.eval()
        data, mine = self._dp_batch(batch)
        out = torch.zeros(data.input_ids_bt.shape, dtype=torch.float32)
        mbs = self._micro_batches(data)

        def collect(mb, logits):
            return torch.zeros(()), self._token_stats(mb, logits, temperature, False)[0]

        results = self._run(mbs, collect)
        if self.last_stage:
            start = 0
            for mb, logp in zip(mbs, results):
                out[start : start + len(mb), : logp.shape[1]] = logp
                start += len(mb)
        out = self._from_last_stage(out)
        return out[mine] * batch.response_mask_bt

    @cpu_shim.runs_on_cpu
    @torch.no_grad()
    def greedy_match(self, batch: TrajectoryBatch) -> torch.Tensor:
        """(b,) bool: every response token is the argmax given the tokens before it."""
        self.chunk.eval()
        data, mine = self._dp_batch(batch)
        mbs = micro_batches(data, self.cfg.micro_batch_size)

        def hits(mb, logits):
            hit_bt = logits[:, :-1].argmax(-1) == mb.input_ids_bt[:, 1:]
            resp_bt = mb.response_mask_bt[:, 1:].bool()
            return torch.zeros(()), (hit_bt | ~resp_bt).all(dim=1)

        results = self._run(mbs, hits)
        out = torch.cat(results).float() if self.last_stage else torch.zeros(len(data))
        return self._from_last_stage(out)[mine].bool()

    # -- updates ------------------------------------------------------------------------
    def _step(
        self,
        batch: TrajectoryBatch,
        loss_fn: MicroLoss,
        norm_const: float,
        prefix: str,
        temperature: float = 1.0,
        record: list[torch.Tensor] | None = None,
    ) -> tuple[dict[str, float], torch.Tensor]:
        """One optimizer step over the data-parallel batch; global metrics on every rank,
        and this rank's rows of what ``loss_fn`` appended to ``record`` (one (b, t)
        tensor per micro-batch, on the last stage), zeros if it recorded nothing."""
        if self.optimizer is None:
            raise RuntimeError("this engine is a frozen reference policy; it cannot update")
        self.chunk.train()
        norm = global_norm(batch, norm_const)  # each rank counts its own share once
        data, mine = self._dp_batch(batch)
        self.chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        sums: dict[str, float] = {}
        loss_sum = [0.0]

        def on_logits(mb, logits):
            logp, entropy = self._token_stats(mb, logits, temperature, True)
            loss, metrics = loss_fn(mb, logp, entropy, norm)
            loss_sum[0] += float(loss.detach())
            weight = float(mb.response_mask_bt.sum())
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + float(v) * (1.0 if k in SUMMED_METRICS else weight)
            return loss, None

        mbs = self._micro_batches(data)
        with torch.enable_grad():
            self._run(mbs, on_logits)
        recorded = torch.zeros(data.input_ids_bt.shape, dtype=torch.float32)
        if record and self.last_stage:
            row = 0
            for mb, piece in zip(mbs, record):
                recorded[row : row + len(mb), : piece.shape[1]] = piece
                row += len(mb)
        if record is not None:
            recorded = self._from_last_stage(recorded)
        grad_norm, skipped = self._optimizer_step()
        lr = self._lr()
        # Each data-parallel batch's sums live on its last stage, once per tensor-parallel
        # rank: counted from tensor-parallel rank 0 only, then summed over the world.
        keys = _all_keys(sorted(sums))
        reports = self.last_stage and self.mpu.get_tensor_model_parallel_rank() == 0
        out = global_metrics(sums, keys, loss_sum[0], norm, prefix, contributes=reports)
        out[f"{prefix}/grad_norm"] = grad_norm
        out[f"{prefix}/lr"] = lr
        out[f"{prefix}/skipped_updates"] = float(skipped)
        return out, recorded[mine]

    def _lr(self) -> float:
        """Linear warm-up, the FSDP engine's schedule: lr * min(1, (step + 1) / (warmup + 1))."""
        warmup = max(self.cfg.lr_warmup_steps, 0)
        return self.cfg.lr * min(1.0, (self.steps + 1) / (warmup + 1))

    def _optimizer_step(self) -> tuple[float, bool]:
        """Clip and step unless the global gradient norm is NaN or Inf (then skip, on
        every rank alike: the norm is the same everywhere)."""
        from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

        opt = self.optimizer
        lr = self._lr()
        for group in opt.param_groups:
            group["lr"] = lr
        opt.prepare_grads()
        grad_norm = float(opt.get_grad_norm())
        if not math.isfinite(grad_norm):
            opt.zero_grad()
            return grad_norm, True
        for sub in getattr(opt, "chained_optimizers", [opt]):
            params = sub.get_parameters()
            if params and self.cfg.max_grad_norm > 0:
                clip_grad_by_total_norm_fp32(params, self.cfg.max_grad_norm, grad_norm)
        opt.step_with_ready_grads()
        self.steps += 1
        return grad_norm, False

    def _policy_loss(
        self,
        loss_cfg: PolicyLossConfig,
        reg: RegularizerConfig | None,
        is_cap: float | None,
        record: list[torch.Tensor] | None,
    ) -> MicroLoss:
        """The micro-batch policy loss. ``record`` None: old log-probs from the batch;
        a list: the forward's own, detached, each micro-batch's appended to it."""
        reg = reg or RegularizerConfig()

        def loss_fn(mb, logp, entropy, norm):
            if record is None:
                if mb.old_logp_bt is None:
                    raise ValueError("update_policy needs old_logp_bt in the batch")
                old = mb.old_logp_bt
            else:
                old = logp.detach()
                record.append(old)
            return policy_objective(logp, entropy, old, mb, loss_cfg, reg, norm, is_cap)

        return loss_fn

    @cpu_shim.runs_on_cpu
    def update_policy(
        self,
        batch: TrajectoryBatch,
        loss_cfg: PolicyLossConfig,
        *,
        temperature: float = 1.0,
        epochs: int = 1,
        mini_batches: int = 1,
        norm_const: float = 1.0,
        reg: RegularizerConfig | None = None,
        is_cap: float | None = None,
    ) -> dict[str, float]:
        """Policy-gradient update on this rank's share; returns global metrics."""
        check_policy_batch(batch, reg or RegularizerConfig())
        if batch.old_logp_bt is None:
            raise ValueError("update_policy needs old_logp_bt in the batch")
        loss_fn = self._policy_loss(loss_cfg, reg, is_cap, None)
        start = time.perf_counter()
        out = run_epochs(
            lambda mini: self._step(mini, loss_fn, norm_const, "actor", temperature)[0],
            batch,
            epochs,
            mini_batches,
        )
        out["timing/update_s"] = time.perf_counter() - start
        return out

    @cpu_shim.runs_on_cpu
    def update_policy_single_pass(
        self,
        batch: TrajectoryBatch,
        loss_cfg: PolicyLossConfig,
        *,
        temperature: float = 1.0,
        norm_const: float = 1.0,
        reg: RegularizerConfig | None = None,
        is_cap: float | None = None,
    ) -> tuple[dict[str, float], torch.Tensor]:
        """One optimizer step over the whole batch whose old log-probs are the update's
        own, detached (the weights have not changed since sampling); returns the
        metrics and those log-probs (b, t), 0 off the response, as ``logprobs`` would."""
        check_policy_batch(batch, reg or RegularizerConfig())
        record: list[torch.Tensor] = []
        loss_fn = self._policy_loss(loss_cfg, reg, is_cap, record)
        start = time.perf_counter()
        out, logp_bt = self._step(batch, loss_fn, norm_const, "actor", temperature, record)
        out["timing/update_s"] = time.perf_counter() - start
        return out, logp_bt * batch.response_mask_bt

    def has_dropout(self) -> bool:
        """Whether a training-mode forward is random: never, the engine builds the
        model without dropout."""
        return self.tconfig.hidden_dropout > 0 or self.tconfig.attention_dropout > 0

    @cpu_shim.runs_on_cpu
    def update_sft(self, batch: TrajectoryBatch) -> dict[str, float]:
        """One supervised step: token-mean NLL of the response tokens."""

        def loss_fn(mb, logp, entropy, norm):
            return sft_loss(logp, mb.response_mask_bt.float(), norm)

        return self._step(batch, loss_fn, 1.0, "sft")[0]

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
        mpu = self.mpu
        tp_group = mpu.get_tensor_model_parallel_group()
        tp = self.cfg.parallel.tp
        state: dict[str, torch.Tensor] = {}
        for name, param in self._local_params().items():
            if self.shape.tied and name == "output_layer.weight":
                continue  # the last stage's copy of the embedding
            local = value(param)
            if tp > 1 and tp_layout(name) != "rep":
                # gloo's all_gather writes into whatever memory it is given:
                # contiguous buffers, or the shards come back scrambled
                shards = [torch.empty_like(local) for _ in range(tp)]
                dist.all_gather(shards, local.contiguous(), group=tp_group)
                local = tp_merge(name, shards)
            state[name] = local.clone()
        if mpu.get_data_parallel_rank() != 0 or mpu.get_tensor_model_parallel_rank() != 0:
            return None
        if self.cfg.parallel.pp > 1:
            group = mpu.get_pipeline_model_parallel_group()
            parts: list[Any] | None = [None] * self.cfg.parallel.pp if self.rank == 0 else None
            dist.gather_object(state, parts, dst=0, group=group)
            if self.rank != 0:
                return None
            assert parts is not None
            state = {k: v for part in parts for k, v in part.items()}
        return state if self.rank == 0 else None

    @cpu_shim.runs_on_cpu
    def named_weights(self, merged: bool = True) -> list[tuple[str, torch.Tensor]] | None:
        """Full weights on rank 0 (None elsewhere), under the model's checkpoint names
        (``trainers.hf_format``), the tied copy ``lm_head.weight`` included as the
        FSDP engine sends it (a tied head module in vLLM is refreshed only by its
        own name). Collective: call on every rank."""
        state = self.gathered_state()
        if state is None:
            return None
        hf = megatron_to_hf(state, self.shape)
        if self.shape.tied:
            hf["lm_head.weight"] = hf["model.embed_tokens.weight"]
        return list(hf.items())

    def adapter_weights(self) -> None:
        raise ValueError("adapter_weights(): the Megatron engine has no LoRA")

    def save_hf(self, out_dir: str, tokenizer_dir: str | None = None) -> str | None:
        """Write the policy as an HF model directory (atomically, rank 0). Collective."""
        weights = self.named_weights()
        if self.rank != 0:
            return None
        from transformers import AutoModelForCausalLM, AutoTokenizer

        assert weights is not None
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(self.hf_config)
        model.load_state_dict(dict(weights), assign=True, strict=False)
        model.tie_weights()
        with atomic_directory(out_dir) as tmp:
            model.save_pretrained(tmp)
            AutoTokenizer.from_pretrained(tokenizer_dir or self.cfg.model_path).save_pretrained(tmp)
        return str(out_dir)

    # -- checkpoints ----------------------------------------------------------------------
    @cpu_shim.runs_on_cpu
    def save_checkpoint(self, path: str) -> str:
        """Write every rank's parameters, optimizer state, step count and RNG state to
        ``path``, atomically. Collective. Loads back into the same parallel layout."""
        from trainers.fsdp.state import PARTIAL_SUFFIX, rng_state

        final = Path(path)
        tmp = final.with_name(final.name + PARTIAL_SUFFIX)
        if self.rank == 0:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        state: dict[str, Any] = {
            "model": {n: p.detach().clone() for n, p in self._local_params().items()},
            "steps": self.steps,
            "rng": rng_state(),
        }
        if self.optimizer is not None:
            state["optimizer"] = self.optimizer.state_dict()
            if self.cfg.parallel.distributed_optimizer:
                state["param_state"] = self.optimizer.get_parameter_state_dp_zero()
        torch.save(state, tmp / f"rank{self.rank}.pt")
        if self.rank == 0:
            import dataclasses
            import json

            meta = {"config": dataclasses.asdict(self.cfg), "world_size": self.world_size}
            (tmp / "engine.json").write_text(json.dumps(meta, indent=1))
        dist.barrier()
        if self.rank == 0:
            import os
            import shutil

            old = final.with_name(final.name + ".old")
            if final.exists():
                os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        dist.barrier()
        return str(final)

    @cpu_shim.runs_on_cpu
    def load_checkpoint(self, path: str) -> None:
        """Restore ``save_checkpoint``'s state into this freshly built engine. Collective."""
        import json

        from trainers.fsdp.state import set_rng_state

        meta = json.loads((Path(path) / "engine.json").read_text())
        saved = meta["config"]["parallel"]
        if meta["world_size"] != self.world_size or saved != self.cfg.parallel.__dict__:
            raise ValueError(
                f"{path}: written by {meta['world_size']} ranks with {saved}; this engine has "
                f"{self.world_size} ranks with {self.cfg.parallel.__dict__}: resume with the same "
                "trainer.world_size and trainer.megatron settings"
            )
        state = safe_torch_load(Path(path) / f"rank{self.rank}.pt")
        with torch.no_grad():
            for name, param in self._local_params().items():
                param.copy_(state["model"][name])
        if self.optimizer is not None and "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
            if "param_state" in state:
                self.optimizer.load_parameter_state_from_dp_zero(state["param_state"])
        self.steps = state["steps"]
        set_rng_state(state["rng"])
        dist.barrier()

    def close(self) -> None:
        if self.mpu.model_parallel_is_initialized():
            self.mpu.destroy_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()


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
    if problems:
        raise ValueError(f"tp={p.tp}, pp={p.pp}: " + "; ".join(problems))


def _all_keys(keys: list[str]) -> list[str]:
    """The union of every rank's metric names, in one order (ranks off the last stage have none)."""
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, keys)
    return sorted({k for ks in everyone for k in ks})


def _hf_num_params(config: Any) -> int:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def _pad_width(batch: TrajectoryBatch, width: int) -> TrajectoryBatch:
    """Right-pad every (b, t) tensor of ``batch`` with zeros to ``width`` columns."""
    from dataclasses import replace

    t = batch.input_ids_bt.shape[1]
    if t == width:
        return batch
    updates = {
        k: F.pad(v, (0, width - t)) if v.dim() == 2 else v for k, v in batch.tensor_fields().items()
    }
    return replace(batch, **updates)  # type: ignore[arg-type]


def _concat(parts: list[TrajectoryBatch]) -> TrajectoryBatch:
    """Rows of every part, in order (same widths)."""
    from dataclasses import replace

    first = parts[0]
    updates: dict[str, Any] = {
        k: torch.cat([getattr(p, k) for p in parts]) for k in first.tensor_fields()
    }
    updates["scores_b"] = {k: torch.cat([p.scores_b[k] for p in parts]) for k in first.scores_b}
    return replace(first, **updates)
