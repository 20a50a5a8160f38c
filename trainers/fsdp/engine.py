"""FSDP2 policy engine: log-probs, policy/SFT updates, HF-named weight export.

Legend: b = samples, t = tokens, v = vocab.

One engine object lives in each rank's process; ranks join one process group
(gloo on CPU, NCCL on CUDA, HCCL on Ascend) and shard the model with
``fully_shard``. Every rank receives its own share of the batch; loss
normalisers are global counts (all-reduced), so the gradient does not depend
on how the batch was split over ranks and micro-batches.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from rlpost.algos import (
    LossNorm,
    PolicyLossConfig,
    sft_loss,
)
from rlpost.trainers.batch import TrajectoryBatch
from rlpost.trainers.engine_config import EngineConfig
from rlpost.trainers.files import atomic_directory
from rlpost.trainers.fsdp.common import (
    DTYPES,
    LossFn,
    OptimConfig,
    Updater,
    init_distributed,
    micro_batches,
    pack,
    run_epochs,
    shard,
    unpack,
)
from rlpost.trainers.fsdp.lora import (
    LoraSettings,
    adapter_config,
    adapter_tensors,
    apply_lora,
    decoder_layers,
    merged_hf_weights,
    save_adapter,
)
from rlpost.trainers.hf_format import (
    auto_class,
    load_model,
    placeholder_token_ids,
    save_preprocessing,
    to_checkpoint_format,
    use_hub_layout,
    vision_parameters,
)
from rlpost.trainers.logprobs import token_logprobs as token_logprobs  # re-exported
from rlpost.trainers.logprobs import token_logprobs_and_entropy
from rlpost.trainers.objectives import RegularizerConfig as RegularizerConfig  # re-exported
from rlpost.trainers.objectives import check_policy_batch, policy_objective


@dataclass(frozen=True)
class FSDPEngineConfig(EngineConfig):
    lora: LoraSettings = field(default_factory=LoraSettings)  # rank 0: full fine-tuning
    gradient_checkpointing: bool = False  # recompute layer activations in backward
    param_offload: bool = False  # FSDP2 CPUOffloadPolicy: params, grads, optimizer on CPU
    optimizer_offload: bool = False  # only together with param_offload (FSDP2 offers no other)
    freeze_vision: bool = True  # VL models: no gradient to the vision tower and projector
    mixed_precision: str = "none"  # "bf16": bf16 compute, fp32 master weights and reduction

    def check(self) -> None:
        """Raise on settings that cannot work together, saying what to change."""
        if self.optimizer_offload and not self.param_offload:
            raise ValueError(
                "optimizer_offload=True: FSDP2 offloads the optimizer state together with the "
                "parameters (CPUOffloadPolicy); set param_offload=True as well"
            )
        if self.mixed_precision not in ("none", "bf16"):
            raise ValueError(f"mixed_precision={self.mixed_precision!r}: expected none or bf16")
        if self.mixed_precision == "bf16" and self.dtype != "float32":
            raise ValueError(
                "mixed_precision=bf16 keeps fp32 master weights: load the model with dtype=float32"
            )

    def optim(self) -> OptimConfig:
        return OptimConfig(
            lr=self.lr,
            weight_decay=self.weight_decay,
            betas=self.betas,
            max_grad_norm=self.max_grad_norm,
            lr_warmup_steps=self.lr_warmup_steps,
        )


class FSDPEngine:
    def __init__(self, cfg: FSDPEngineConfig, rank: int, world_size: int, init_method: str):
        cfg.check()
        torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.device = init_distributed(cfg.device, cfg.backend, rank, world_size, init_method)
        model = load_model(cfg.model_path, DTYPES[cfg.dtype])
        model.to(self.device)  # type: ignore[arg-type]
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
        shard(
            model,
            decoder_layers(model),
            offload=cfg.param_offload,
            mixed_precision=cfg.mixed_precision,
        )
        self.model = model
        self.updater = (
            Updater(model, cfg.optim(), world_size, self._micro_batches) if cfg.trainable else None
        )
        # What the transformers model's forward takes (under LoRA too, whose wrapper
        # passes image inputs on as keyword arguments).
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self._forward_args = set(inspect.signature(base.forward).parameters)
        self._never_sample = placeholder_token_ids(model.config)
        self.num_params = sum(p.numel() for p in model.parameters())
        self.num_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)

    def _micro_batches(self, batch: TrajectoryBatch) -> list[TrajectoryBatch]:
        c = self.cfg
        return micro_batches(batch, c.micro_batch_size, c.micro_batch_tokens, c.packing)

    # -- forward passes -------------------------------------------------------
    def _logits(self, mb: TrajectoryBatch) -> torch.Tensor:
        """The model's logits (b, t, v) in its dtype: no float32 copy, no temperature
        (``token_logprobs_and_entropy`` applies both a few tokens at a time)."""
        ids = mb.input_ids_bt.to(self.device)
        mask = mb.attention_mask_bt.to(self.device)
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
        self, mb: TrajectoryBatch, temperature: float, entropy_grad: bool | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (b, t) of ``mb``'s tokens and, unless ``entropy_grad`` is None, the
        entropy (b, t) of each position's predictive distribution (with grad if True).

        Packed (``cfg.packing``): one forward pass over the concatenated samples,
        no padding tokens; values are scattered back to the padded layout.
        """
        with_entropy = entropy_grad is not None
        if not self.cfg.packing or mb.mm_inputs_b is not None:  # images: padded rows
            ids = mb.input_ids_bt.to(self.device)
            stats = token_logprobs_and_entropy(self._logits(mb), ids, temperature, with_entropy)
        else:
            ids_1T, pos_1T, lengths = pack(mb)
            ids_1T, pos_1T = ids_1T.to(self.device), pos_1T.to(self.device)
            logits = self.model(input_ids=ids_1T, position_ids=pos_1T, use_cache=False).logits
            stats_1T = token_logprobs_and_entropy(logits, ids_1T, temperature, with_entropy)
            width = mb.input_ids_bt.shape[1]
            stats = (unpack(stats_1T[0], lengths, width), unpack(stats_1T[1], lengths, width))
        logp, entropy = stats
        if entropy_grad is None:
            return logp, None
        return logp, entropy if entropy_grad else entropy.detach()

    @contextmanager
    def _adapter_off(self, disable: bool) -> Iterator[None]:
        if not disable:
            yield
            return
        if not self.cfg.lora.enabled:
            raise ValueError("disable_adapter=True needs a LoRA engine (lora.rank > 0)")
        with self.model.disable_adapter():  # type: ignore[operator]
            yield

    @torch.no_grad()
    def logprobs(
        self, batch: TrajectoryBatch, temperature: float = 1.0, disable_adapter: bool = False
    ) -> torch.Tensor:
        """Log-probs (b, t) of this rank's batch under the current weights (0 off the response).

        ``disable_adapter=True`` (LoRA only) scores with the base model, i.e. the
        frozen reference policy of a KL term, without a second copy of the model.
        """
        self.model.eval()
        out = torch.zeros(batch.input_ids_bt.shape, dtype=torch.float32)
        start = 0
        with self._adapter_off(disable_adapter):
            for mb in self._micro_batches(batch):
                logp = self._token_stats(mb, temperature, None)[0].cpu()
                out[start : start + len(mb), : logp.shape[1]] = logp
                start += len(mb)
        return out * batch.response_mask_bt

    def ref_logprobs(self, batch: TrajectoryBatch, temperature: float = 1.0) -> torch.Tensor:
        """Reference-policy log-probs of a LoRA engine: the base model, adapter disabled."""
        return self.logprobs(batch, temperature, disable_adapter=True)

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

    # -- updates --------------------------------------------------------------
    def _updater(self) -> Updater:
        if self.updater is None:
            raise RuntimeError("this engine is a frozen reference policy; it cannot update")
        return self.updater

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
        """Policy-gradient update on this rank's share; returns global metrics.

        ``is_cap`` set and ``rollout_logp_bt`` in the batch: each token's advantage is
        scaled by the truncated importance weight min(pi_old / pi_rollout, is_cap).
        """
        if batch.old_logp_bt is None:
            raise ValueError(
                "update_policy needs old_logp_bt in the batch (update_policy_single_pass "
                "takes the old log-probs from its own forward)"
            )
        loss_fn = self._policy_loss_fn(batch, loss_cfg, temperature, reg, is_cap, None)
        updater = self._updater()
        start = time.perf_counter()
        out = run_epochs(
            lambda mini: updater.step(mini, loss_fn, norm_const, "actor"),
            batch,
            epochs,
            mini_batches,
        )
        out["timing/update_s"] = time.perf_counter() - start
        return out

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
        """One optimizer step over the whole batch (one epoch, one mini-batch) whose old
        log-probs are the update's own, detached: the weights have not changed since
        sampling, so ``update_policy`` after a ``logprobs`` call would compute the
        same loss and gradient with one forward pass more.

        Returns the metrics and those log-probs (b, t) as ``logprobs`` returns them
        (0 off the response), e.g. for the rollout parity check. The batch's own
        ``old_logp_bt`` is ignored.
        """
        pieces: list[torch.Tensor] = []
        loss_fn = self._policy_loss_fn(batch, loss_cfg, temperature, reg, is_cap, pieces)
        start = time.perf_counter()
        out = self._updater().step(batch, loss_fn, norm_const, "actor")
        out["timing/update_s"] = time.perf_counter() - start
        logp_bt = torch.zeros(batch.input_ids_bt.shape, dtype=torch.float32)
        row = 0
        for piece in pieces:  # one per micro-batch, in batch order
            logp_bt[row : row + len(piece), : piece.shape[1]] = piece
            row += len(piece)
        return out, logp_bt * batch.response_mask_bt

    def _policy_loss_fn(
        self,
        batch: TrajectoryBatch,
        loss_cfg: PolicyLossConfig,
        temperature: float,
        reg: RegularizerConfig | None,
        is_cap: float | None,
        record: list[torch.Tensor] | None,
    ) -> LossFn:
        """The micro-batch loss of a policy update. ``record`` is None: the old log-probs
        come from the batch; a list: they are the forward's own, detached, and each
        micro-batch's log-probs are appended to it."""
        reg = reg or RegularizerConfig()
        check_policy_batch(batch, reg)

        def loss_fn(mb: TrajectoryBatch, norm: LossNorm) -> tuple[torch.Tensor, dict[str, float]]:
            logp, entropy = self._token_stats(mb, temperature, reg.entropy_coef != 0)
            assert entropy is not None
            if record is None:
                assert mb.old_logp_bt is not None
                old_logp = mb.old_logp_bt.to(self.device)
            else:
                old_logp = logp.detach()
                record.append(old_logp.cpu())
            return policy_objective(logp, entropy, old_logp, mb, loss_cfg, reg, norm, is_cap)

        return loss_fn

    def update_sft(self, batch: TrajectoryBatch) -> dict[str, float]:
        """One supervised step: token-mean NLL of the response tokens."""

        def loss_fn(mb: TrajectoryBatch, norm: LossNorm):
            logp = self._token_stats(mb, 1.0, None)[0]
            return sft_loss(logp, mb.response_mask_bt.to(self.device).float(), norm)

        return self._updater().step(batch, loss_fn, 1.0, "sft")

    # -- weights --------------------------------------------------------------
    def _full_state(self) -> dict[str, torch.Tensor] | None:
        """Every tensor of the (possibly PEFT-wrapped) model, gathered on rank 0. Collective."""
        out = {}
        for name, tensor in self.model.state_dict().items():
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            if self.rank == 0:
                out[name] = full.detach().cpu()
        return out if self.rank == 0 else None

    def named_weights(self, merged: bool = True) -> list[tuple[str, torch.Tensor]] | None:
        """Full weights on rank 0 (None elsewhere), named and laid out as in the model's
        checkpoint files (``rlpost.trainers.hf_format``). Collective: call on every rank.

        Under LoRA the adapter is folded in (``W + alpha/r * B A``) and the names are
        the base model's, so an engine without LoRA support loads them as they are
        (``rollout.lora_sync=merged``). ``merged=False`` is refused under LoRA: the
        unmerged view is ``adapter_weights``.
        """
        if self.cfg.lora.enabled and not merged:
            raise ValueError("named_weights(merged=False) under LoRA: use adapter_weights()")
        state = self._hf_state()
        if state is None:
            return None
        return list(to_checkpoint_format(self.model, state).items())

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

    # -- checkpoints ------------------------------------------------------------
    def save_checkpoint(self, path: str) -> str:
        """Write sharded model (the adapter only, under LoRA), optimizer, LR schedule and
        RNG states to ``path``, atomically. Collective: call on every rank."""
        from rlpost.trainers.fsdp.state import save_engine

        opt = self.updater.optimizer if self.updater else None
        sched = self.updater.scheduler if self.updater else None
        frozen_base = self.cfg.lora.enabled
        save_engine(path, self.model, opt, sched, self.cfg, self.rank, self.world_size, frozen_base)
        return str(path)

    def load_checkpoint(self, path: str) -> None:
        """Restore ``save_checkpoint``'s state into this freshly built engine. Collective.

        The engine must be built with the same model path and LoRA settings; the
        world size may differ (DCP reshards; RNG states then come from rank 0).
        """
        from rlpost.trainers.fsdp.state import load_engine

        opt = self.updater.optimizer if self.updater else None
        sched = self.updater.scheduler if self.updater else None
        load_engine(path, self.model, opt, sched, self.rank, self.cfg.lora.enabled)

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
