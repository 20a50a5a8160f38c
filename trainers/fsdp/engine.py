"""FSDP2 policy engine: the model, its forward passes, LoRA and HF-named weight export.

Legend: b = samples, t = tokens, v = vocab, T = tokens of one packed row.

One engine object lives in each rank's process; ranks join one process group
(gloo on CPU, NCCL on CUDA, HCCL on Ascend) and shard the model with
``fully_shard``. Every rank receives its own share of the batch. Log-probs,
updates and checkpoints are ``rlpost.trainers.policy``'s, shared with the
Megatron engine; this module supplies the forward pass (``FSDPBackend``), the
log-probs of its logits and the checkpoint state (``FSDPState``).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, Shard

from rlpost.runtime import device as devices
from rlpost.runtime.hf_format import (
    auto_class,
    load_model,
    placeholder_token_ids,
    save_preprocessing,
    to_checkpoint_format,
    use_hub_layout,
    vision_parameters,
)
from rlpost.trainers.batch import TrajectoryBatch
from rlpost.trainers.distributed import Empty, gather_into, init_distributed, new_tensor
from rlpost.trainers.engine_config import EngineConfig, torch_dtype
from rlpost.trainers.files import atomic_directory
from rlpost.trainers.fsdp.common import FSDPBackend, shard
from rlpost.trainers.fsdp.lora import (
    LoraSettings,
    adapter_config,
    adapter_tensors,
    apply_lora,
    decoder_layers,
    merged_hf_weights,
    save_adapter,
)
from rlpost.trainers.fsdp.state import FSDPState
from rlpost.trainers.fsdp.ulysses import ATTENTION as ULYSSES_ATTENTION
from rlpost.trainers.fsdp.ulysses import SequenceParallel, next_ids
from rlpost.trainers.logprobs import (
    hidden_token_stats,
    next_token_stats,
    token_logprobs_and_entropy,
)
from rlpost.trainers.logprobs import token_logprobs as token_logprobs  # re-exported
from rlpost.trainers.micro_batching import micro_batches, pack, packed_values, unpack
from rlpost.trainers.objectives import RegularizerConfig as RegularizerConfig  # re-exported
from rlpost.trainers.policy import PolicyUpdates
from rlpost.trainers.prefix_sharing import PrefixSharing, SharedRows


@dataclass(frozen=True)
class FSDPEngineConfig(EngineConfig):
    trainer: ClassVar[str] = "fsdp"

    lora: LoraSettings = field(default_factory=LoraSettings)  # rank 0: full fine-tuning
    gradient_checkpointing: bool = False  # recompute layer activations in backward
    param_offload: bool = False  # FSDP2 CPUOffloadPolicy: params, grads, optimizer on CPU
    optimizer_offload: bool = False  # only together with param_offload (FSDP2 offers no other)
    freeze_vision: bool = True  # VL models: no gradient to the vision tower and projector
    mixed_precision: str = "none"  # "bf16": bf16 compute, fp32 master weights and reduction
    ulysses: int = 1  # sequence-parallel ranks per sample (trainers/fsdp/ulysses.py)
    compile: bool = False  # torch.compile each decoder layer and the log-prob chunk kernels

    def check(self) -> None:
        """Raise on settings that cannot work together, saying what to change."""
        if self.optimizer_offload and not self.param_offload:
            raise ValueError(
                "optimizer_offload=True: FSDP2 offloads the optimizer state together with the "
                "parameters (CPUOffloadPolicy); set param_offload=True as well"
            )
        if self.mixed_precision not in ("none", "bf16"):
            raise ValueError(f"mixed_precision={self.mixed_precision!r}: expected none or bf16")
        if self.prefix_sharing not in ("off", "on", "auto"):
            raise ValueError(f"prefix_sharing={self.prefix_sharing!r}: expected off, on or auto")
        if self.mixed_precision == "bf16" and self.dtype != "float32":
            raise ValueError(
                "mixed_precision=bf16 keeps fp32 master weights: load the model with dtype=float32"
            )


class FSDPEngine(PolicyUpdates):
    def __init__(self, cfg: FSDPEngineConfig, rank: int, world_size: int, init_method: str):
        cfg.check()
        torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.device = init_distributed(cfg.device, cfg.backend, rank, world_size, init_method)
        model = load_model(cfg.model_path, torch_dtype(cfg.dtype))
        model.to(self.device)  # type: ignore[arg-type]
        self.sp = None
        if cfg.ulysses > 1:
            self.sp = SequenceParallel(cfg.ulysses, rank, world_size)
            model.set_attn_implementation(ULYSSES_ATTENTION)
        if cfg.freeze_vision:  # a VL model trains its language model only
            for p in vision_parameters(model):
                p.requires_grad_(False)
        if cfg.gradient_checkpointing:
            # Non-reentrant checkpointing needs no input that requires grad,
            # which matters under LoRA where the embeddings are frozen.
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        if cfg.lora.enabled:
            model = apply_lora(model, cfg.lora, cfg.model_path)
        if not cfg.trainable:
            model.requires_grad_(False)
        if cfg.compile:
            problem = devices.compile_problem(self.device.type)
            if problem is not None:
                raise RuntimeError(f"trainer.compile=true: {problem}; or set trainer.compile=false")
            # Regional compilation: each block compiled in place before FSDP2 wraps it
            # (its hooks stay outside the graph). The blocks share their code, so one
            # compile serves them all; a new micro-batch shape compiles again, after
            # which the lengths are symbolic.
            for layer in decoder_layers(model):
                layer.compile()
        shard(
            model,
            decoder_layers(model),
            offload=cfg.param_offload,
            mixed_precision=cfg.mixed_precision,
        )
        self.model = model
        # What the transformers model's forward takes (under LoRA too, whose wrapper
        # passes image inputs on as keyword arguments).
        unwrap = getattr(model, "get_base_model", None)  # a LoRA wrapper's
        base = model if unwrap is None else unwrap()
        self._forward_args = set(inspect.signature(base.forward).parameters)
        self._never_sample = placeholder_token_ids(model.config)
        self._sharing = PrefixSharing(
            cfg.prefix_sharing, base.config, self.sp is not None, cfg.packing
        )
        # the output layer whose logits the log-probs compute a chunk at a time
        # (``hidden_token_stats``), or None where the model's logits are taken whole
        self._head = self._fusable_head()
        self.num_params = sum(p.numel() for p in model.parameters())
        self.num_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        optim = cfg if cfg.trainable else None
        backend = FSDPBackend(
            model, world_size, self._micro_batches, self._output, optim, self.sp, cfg.param_offload
        )
        # its optimizer and LR schedule (None for a frozen reference policy)
        self.updater = backend if cfg.trainable else None
        state = FSDPState(
            model, backend.optimizer, backend.scheduler, cfg, rank, world_size, cfg.lora.enabled
        )
        self._layerwise: bool | None = None  # weight_stream: can it convert layer by layer
        self._specs: list[tuple[str, tuple[int, ...], torch.dtype]] = []
        super().__init__(backend, self._token_stats, state)

    def _micro_batches(self, batch: TrajectoryBatch) -> list[TrajectoryBatch]:
        c = self.cfg
        return micro_batches(batch, c.micro_batch_size, c.micro_batch_tokens, c.packing)

    # -- forward passes -------------------------------------------------------
    def _packed(self, mb: TrajectoryBatch) -> bool:
        """Whether ``mb``'s outputs come in the packed layout: ``cfg.packing`` or a
        shared prefix, and no images (a VL micro-batch keeps its padded rows)."""
        return mb.mm_inputs_b is None and (self.cfg.packing or self._sharing.rows(mb) is not None)

    def _output(self, mb: TrajectoryBatch) -> torch.Tensor:
        """The logits of ``mb``: (b, t, v), or (1, T, v) when packed (one forward pass
        over the concatenated samples, no padding tokens); under ``trainer.ulysses``,
        this rank's slice of the tokens of either."""
        if self.sp is not None:
            ids, lengths = self._rows(mb)
            ids_bl, pos_bl, segments = self.sp.inputs(ids, lengths)
            with self.sp.attending(segments):
                return self.model(
                    input_ids=devices.upload(ids_bl, self.device),
                    position_ids=devices.upload(pos_bl, self.device),
                    use_cache=False,
                ).logits
        shared = self._sharing.rows(mb)
        if shared is not None:
            return self._shared_output(mb, shared)
        if not self._packed(mb):
            if not self._fused(mb):
                return self._logits(mb)
            ids, mask = (
                devices.upload(mb.input_ids_bt, self.device),
                devices.upload(mb.attention_mask_bt, self.device),
            )
            with self._hidden_out():
                return self.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        ids_1T, pos_1T, _ = pack(mb)
        ids_1T, pos_1T = devices.upload(ids_1T, self.device), devices.upload(pos_1T, self.device)
        with self._hidden_out() if self._fused(mb) else nullcontext():
            return self.model(input_ids=ids_1T, position_ids=pos_1T, use_cache=False).logits

    def _shared_output(self, mb: TrajectoryBatch, trees: SharedRows) -> torch.Tensor:
        """``_output``'s packed (1, T, ...) from one forward pass over ``mb``'s prefix
        trees: each token's output gathered from its place in its tree."""
        dtype = next(self.model.parameters()).dtype
        with self._hidden_out() if self._fused(mb) else nullcontext():
            out = self.model(**self._sharing.inputs(trees, dtype, self.device), use_cache=False)
        return trees.gather(out.logits)

    # -- the output layer folded into the log-probs ----------------------------
    def _fusable_head(self) -> torch.nn.Linear | None:
        """The output layer, where ``hidden_token_stats`` may stand in for it: a
        bias-free ``Linear`` whose output the model's forward returns untouched (no
        soft-capping or scaling after it, as Gemma 2 or Cohere apply), which a
        4-token forward checks bit for bit. None under ``trainer.ulysses`` and for VL
        models, whose logits are taken whole."""
        head = self.model.get_output_embeddings()
        if self.sp is not None or vision_parameters(self.model):
            return None
        if type(head) is not torch.nn.Linear or head.bias is not None:
            return None
        made: list[torch.Tensor] = []

        def recording(hidden: torch.Tensor) -> torch.Tensor:
            made.append(F.linear(hidden, head.weight))
            return made[-1]

        ids = torch.arange(1, 5, device=self.device)[None] % head.out_features
        with torch.no_grad(), _forward_replaced(head, recording):
            logits = self.model(input_ids=ids, use_cache=False).logits
        # FSDP2 leaves the root's parameters gathered after a forward (and every
        # layer's on one rank): shard them again, so that the optimizer, made next,
        # holds the sharded parameters and not the gathered copies
        for module in self.model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()
        if len(made) != 1 or not torch.equal(logits.to(made[0].dtype), made[0]):
            return None
        return head

    def _fused(self, mb: TrajectoryBatch) -> bool:
        """Whether ``mb``'s output is the last hidden states (the output layer folded
        into the log-probs) rather than logits."""
        return self._head is not None and mb.mm_inputs_b is None

    def _hidden_out(self):  # type: ignore[no-untyped-def]
        """While the block runs, the model returns the output layer's input as its logits."""
        assert self._head is not None
        return _forward_replaced(self._head, lambda hidden: hidden)

    def _logits(self, mb: TrajectoryBatch) -> torch.Tensor:
        """The model's logits (b, t, v) in its dtype: no float32 copy, no temperature
        (``token_logprobs_and_entropy`` applies both a chunk of tokens at a time)."""
        ids = devices.upload(mb.input_ids_bt, self.device)
        mask = devices.upload(mb.attention_mask_bt, self.device)
        images = self._image_inputs(mb, ids)
        logits = self.model(input_ids=ids, attention_mask=mask, use_cache=False, **images).logits
        if self._never_sample:  # the rollout never samples these (placeholder_token_ids)
            logits[..., self._never_sample] = torch.finfo(logits.dtype).min
        return logits

    def _image_inputs(self, mb: TrajectoryBatch, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """A VL micro-batch's image-processor outputs that the forward takes, its
        samples' joined in order (not counts such as InternVL's ``num_patches``).
        Models that place images by token type get ``mm_token_type_ids`` (Qwen-VL)
        or ``token_type_ids`` (Gemma 3, whose image tokens attend to each other
        both ways), 1 on image tokens."""
        if mb.mm_inputs_b is None:
            return {}
        keys = [k for k in mb.mm_inputs_b[0] if k in self._forward_args]
        out = {k: torch.cat([m[k] for m in mb.mm_inputs_b]).to(self.device) for k in keys}
        image_token = getattr(self.model.config, "image_token_id", None)
        for name in ("mm_token_type_ids", "token_type_ids"):
            if image_token is not None and name in self._forward_args:
                out[name] = (ids == image_token).long()
        return out

    def _token_stats(
        self, mb: TrajectoryBatch, logits: torch.Tensor, temperature: float, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (b, t) of ``mb``'s tokens from ``_output``'s logits and the entropy
        (b, t) of each position's prediction (zeros unless ``with_entropy``). Packed
        values are scattered back to the padded layout."""
        if self.sp is not None:
            return self._sp_token_stats(mb, logits, temperature, with_entropy)
        # every caller reads the response tokens only (the losses, the preference
        # log-probs and ``logprobs`` all mask by them): the rest is never computed
        needed = mb.response_mask_bt.bool()

        def stats(
            out: torch.Tensor, ids: torch.Tensor, needed: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            ids = devices.upload(ids, self.device)
            if not self._fused(mb):
                return token_logprobs_and_entropy(
                    out, ids, temperature, with_entropy, needed_bt=needed, compiled=self.cfg.compile
                )
            # ``out`` is the last hidden states, and the weight as the forward left it:
            # gathered whole (FSDP2 keeps the root's parameters unsharded from its
            # forward to its backward)
            assert self._head is not None
            never = tuple(self._never_sample)
            return hidden_token_stats(
                out,
                self._head.weight,
                ids,
                temperature,
                with_entropy,
                never,
                needed_bt=needed,
                compiled=self.cfg.compile,
            )

        if not self._packed(mb):
            return stats(logits, mb.input_ids_bt, needed)
        ids_1T, _, lengths = pack(mb)
        logp_1T, entropy_1T = stats(logits, ids_1T, packed_values(needed, lengths))
        width = mb.input_ids_bt.shape[1]
        return unpack(logp_1T, lengths, width), unpack(entropy_1T, lengths, width)

    def _rows(self, mb: TrajectoryBatch) -> tuple[torch.Tensor, list[int] | None]:
        """The token rows the forward pass runs: one packed row (1, T) and its samples'
        lengths, or the padded rows (b, t) and None."""
        if self._packed(mb):
            ids_1T, _, lengths = pack(mb)
            return ids_1T, lengths
        return mb.input_ids_bt, None

    def _sp_token_stats(
        self, mb: TrajectoryBatch, logits_blv: torch.Tensor, temperature: float, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``_token_stats`` from this rank's slice of the logits: each slice's
        predictions (its last position predicts the next slice's first token),
        gathered from every rank and shifted into place."""
        assert self.sp is not None
        ids, lengths = self._rows(mb)
        width = ids.shape[1]
        nxt_bl = devices.upload(self.sp.local(next_ids(ids, self.sp.padded(width))), self.device)
        logp_bl, entropy_bl = next_token_stats(
            logits_blv, nxt_bl, temperature, with_entropy, self.cfg.compile
        )
        logp = F.pad(self.sp.gather(logp_bl)[:, : width - 1], (1, 0))
        entropy = torch.zeros_like(logp)
        if with_entropy:
            entropy = F.pad(self.sp.gather(entropy_bl)[:, : width - 1], (1, 0))
        if lengths is None:
            return logp, entropy
        full = mb.input_ids_bt.shape[1]
        return unpack(logp, lengths, full), unpack(entropy, lengths, full)

    @contextmanager
    def adapter_off(self, disable: bool) -> Iterator[None]:
        """With ``disable``, the LoRA adapter is off while the block runs (the base model)."""
        if not disable:
            yield
            return
        if not self.cfg.lora.enabled:
            raise ValueError("disable_adapter=True needs a LoRA engine (lora.rank > 0)")
        with self.model.disable_adapter():  # type: ignore[operator]
            yield

    @torch.no_grad()
    def greedy_match(self, batch: TrajectoryBatch) -> torch.Tensor:
        """(b,) bool: every response token is the argmax given the tokens before it.

        Equivalent to "greedy decoding reproduces the response", at the cost of one
        forward pass; used to stop the built-in warm-up at a target accuracy.
        """
        self.model.eval()
        out = []
        for mb in micro_batches(batch, self.cfg.micro_batch_size):
            ids = mb.input_ids_bt.to(self.device)
            hit_bt = self._logits(mb)[:, :-1].argmax(-1) == ids[:, 1:]
            resp_bt = mb.response_mask_bt[:, 1:].to(self.device).bool()
            out.append((hit_bt | ~resp_bt).all(dim=1).cpu())
        return torch.cat(out)

    def has_dropout(self) -> bool:
        """Whether a training-mode forward is random (a dropout layer, LoRA dropout or an
        attention-dropout rate above 0), so that its log-probs are not the sampling
        policy's and cannot stand in for a separate ``logprobs`` call."""
        for module in self.model.modules():
            if isinstance(module, torch.nn.Dropout) and module.p > 0:
                return True
            rate = getattr(module, "attention_dropout", 0.0)
            if isinstance(rate, float) and rate > 0:
                return True
        return False

    # -- weights --------------------------------------------------------------
    def weight_stream(
        self, empty: Empty = new_tensor
    ) -> tuple[list[tuple[str, tuple[int, ...], torch.dtype]], Iterator[tuple[str, torch.Tensor]]]:
        """``named_weights`` a layer at a time: the checkpoint-format names, shapes and
        dtypes of every tensor, and an iterator that gathers one decoder layer (or
        one tensor outside the layers), converts it and hands out its tensors, so
        rank 0 holds one layer beyond its shard instead of the whole model
        (``rollout.weight_sync=collective``). Collective: every rank runs the
        iterator to its end; the tensors reach rank 0 only (nothing elsewhere).
        ``empty(shape, dtype, device)``: the memory each sharded tensor is gathered
        into (the ``ipc`` sync's shared-memory buckets on the CPU).

        Falls back to the whole state at once where converting layer by layer
        would name or shape a tensor differently (a conversion that joins tensors
        of two layers), which the meta-tensor specs show before anything is gathered.
        """
        if self._layerwise is None:
            meta = [
                {n: torch.empty(t.shape, dtype=t.dtype, device="meta") for n, t in g.items()}
                for g in _layer_groups(self.model.state_dict())
            ]
            whole = self._convert({n: t for g in meta for n, t in g.items()})
            parts = [item for g in meta for item in self._convert(g)]
            self._specs = [(n, tuple(t.shape), t.dtype) for n, t in parts]
            found = sorted(self._specs, key=str)
            self._layerwise = found == sorted(
                ((n, tuple(t.shape), t.dtype) for n, t in whole), key=str
            )
            if not self._layerwise:
                self._specs = [(n, tuple(t.shape), t.dtype) for n, t in whole]
        if not self._layerwise:
            return self._specs, self._whole_state()
        return self._specs, self._streamed(empty)

    def _whole_state(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``named_weights`` once iterated (a collective, so every rank iterates it):
        the specs are read without it."""
        yield from self.named_weights() or []

    def _streamed(self, empty: Empty) -> Iterator[tuple[str, torch.Tensor]]:
        for group in _layer_groups(self.model.state_dict()):
            full = {}
            for name, tensor in group.items():
                whole = _whole(tensor, empty).detach()
                if self.rank == 0:
                    full[name] = whole
                del whole  # ranks > 0 keep nothing
            if self.rank == 0:
                yield from self._convert(full)
            del full  # before the next layer's gathers
            devices.trim_host_heap(self.device.type)  # the part's tensors are freed

    def _convert(self, state: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
        """Full tensors under the model's own names -> checkpoint format, LoRA folded in."""
        if self.cfg.lora.enabled:
            state = merged_hf_weights(state, self.cfg.lora)
        return list(to_checkpoint_format(self.model, state).items())

    def _full_state(self) -> dict[str, torch.Tensor] | None:
        """Every tensor of the (possibly PEFT-wrapped) model, gathered on rank 0. Collective."""
        out = {}
        for name, tensor in self.model.state_dict().items():
            full = _whole(tensor, new_tensor)
            if self.rank == 0:
                out[name] = full.detach().cpu()
        return out if self.rank == 0 else None

    def named_weights(self, merged: bool = True) -> list[tuple[str, torch.Tensor]] | None:
        """Full weights on rank 0 (None elsewhere), named and laid out as in the model's
        checkpoint files (``rlpost.runtime.hf_format``). Collective: call on every rank.

        Under LoRA the adapter is folded in (``W + alpha/r * B A``) and the names are
        the base model's, so an engine without LoRA support loads them as they are
        (``rollout.lora_sync=merged``). ``merged=False`` is refused under LoRA: the
        unmerged view is ``adapter_weights``.
        """
        if self.cfg.lora.enabled and not merged:
            raise ValueError("named_weights(merged=False) under LoRA: use adapter_weights()")
        state = self._full_state()
        return None if state is None else self._convert(state)

    def _hf_state(self) -> dict[str, torch.Tensor] | None:
        """Full weights on rank 0 under the transformers model's own names, LoRA
        folded in (None elsewhere). Collective."""
        state = self._full_state()
        if state is not None and self.cfg.lora.enabled:
            state = merged_hf_weights(state, self.cfg.lora)
        return state

    def adapter_weights(self) -> tuple[dict[str, torch.Tensor], dict] | None:
        """The LoRA adapter on rank 0 as ``(tensors, peft_config)`` (None elsewhere).

        Tensor names are PEFT's on-disk names (``...q_proj.lora_A.weight``) and
        ``peft_config`` is the ``adapter_config.json`` content, so a rollout engine
        with LoRA support (``rollout.lora_sync=adapter``) can write and load it.
        Collective: call on every rank.
        """
        if not self.cfg.lora.enabled:
            raise ValueError("adapter_weights() needs a LoRA engine (lora.rank > 0)")
        state = self._full_state()
        if state is None:
            return None
        return adapter_tensors(state), adapter_config(self.model)

    def save_adapter(self, out_dir: str) -> str | None:
        """Write the adapter as a PEFT directory on rank 0 (vLLM's ``LoRARequest`` path)."""
        got = self.adapter_weights()
        if got is None:
            return None
        return str(save_adapter(out_dir, *got))

    def save_hf(self, out_dir: str, tokenizer_dir: str | None = None) -> str | None:
        """Write the policy as an HF model directory (atomically, rank 0). Collective."""
        weights = self._hf_state()  # save_pretrained writes the checkpoint layout itself
        if self.rank != 0:
            return None
        from transformers import AutoConfig

        assert weights is not None
        config = AutoConfig.from_pretrained(self.cfg.model_path)
        with torch.device("meta"):
            model = auto_class(self.cfg.model_path).from_config(config)
        model.load_state_dict(weights, assign=True, strict=False)
        model.tie_weights()
        missing = [n for n, p in model.named_parameters() if p.is_meta]
        if missing:
            raise ValueError(f"save_hf: no weights for {missing[:5]}")
        with atomic_directory(out_dir) as tmp:
            use_hub_layout(model).save_pretrained(tmp)
            save_preprocessing(tokenizer_dir or self.cfg.model_path, tmp)
        return str(out_dir)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


@contextmanager
def _forward_replaced(
    module: torch.nn.Module, forward: Callable[[torch.Tensor], torch.Tensor]
) -> Iterator[None]:
    """``module`` runs ``forward`` instead of its own while the block runs."""
    module.forward = forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        del module.forward


def _whole(tensor: torch.Tensor, empty: Empty) -> torch.Tensor:
    """A parameter whole on every rank: a tensor FSDP2 shards along dim 0 gathered
    into one tensor from ``empty`` (no second copy, ``gather_into``), any other
    DTensor by ``full_tensor``, a plain tensor as it is."""
    if not isinstance(tensor, DTensor):
        return tensor
    mesh, local = tensor.device_mesh, tensor.to_local()
    world, rank = mesh.size(), mesh.get_local_rank()
    # FSDP2's shards are torch.chunk's pieces (rows of ceil(n / world)), empty at the end
    rows = -(-tensor.shape[0] // world) if tensor.ndim else 0
    mine = max(0, min(tensor.shape[0], (rank + 1) * rows) - rank * rows) if rows else 0
    if (
        mesh.ndim != 1
        or tuple(tensor.placements) != (Shard(0),)
        or local.device.type != mesh.device_type
        or local.shape[:1] != (mine,)
    ):
        return tensor.full_tensor()
    full = empty(tuple(tensor.shape), tensor.dtype, local.device)
    views = [full[r * rows : (r + 1) * rows] for r in range(world)]
    gather_into([[v] for v in views], [local], mesh.get_group())
    return full


_LAYER = re.compile(r"(.*?\.(?:layers|blocks|h)\.\d+)\.")


def _layer_groups(state: dict[str, torch.Tensor]) -> Iterator[dict[str, torch.Tensor]]:
    """``state``'s tensors in order, a decoder (or vision) layer's together and each
    tensor outside the layers on its own."""
    group: dict[str, torch.Tensor] = {}
    key = None
    for name, tensor in state.items():
        found = _LAYER.match(name)
        here = found.group(1) if found else name
        if group and here != key:
            yield group
            group = {}
        key = here
        group[name] = tensor
    if group:
        yield group
