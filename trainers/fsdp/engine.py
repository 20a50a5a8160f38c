"""FSDP2 policy engine: log-probs, policy/SFT updates, HF-named weight export.

Legend: b = samples, t = tokens, v = vocab.

One engine object lives in each rank's process; ranks join one process group
(gloo on CPU, NCCL on CUDA, HCCL on Ascend) and shard the model with
``fully_shard``. Every rank receives its own share of the batch; loss
normalisers are global counts (all-reduced), so the gradient does not depend
on how the batch was split over ranks and micro-batches.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from algos import (
    POLICY_LOSSES,
    LossNorm,
    PolicyLossConfig,
    aggregate,
    entropy_from_logits,
    kl_penalty,
    masked_mean,
    sft_loss,
)
from trainers.batch import TrajectoryBatch
from trainers.fsdp.common import (
    DTYPES,
    OptimConfig,
    Updater,
    init_distributed,
    micro_batches,
    run_epochs,
    shard,
)


@dataclass(frozen=True)
class FSDPEngineConfig:
    model_path: str
    dtype: str = "float32"
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)
    max_grad_norm: float = 1.0
    micro_batch_size: int = 64
    seed: int = 0
    device: str = "cpu"
    backend: str = "gloo"
    threads: int = 1
    lr_warmup_steps: int = 0
    trainable: bool = True  # False: a frozen reference policy (no optimizer state)

    def optim(self) -> OptimConfig:
        return OptimConfig(
            lr=self.lr,
            weight_decay=self.weight_decay,
            betas=self.betas,
            max_grad_norm=self.max_grad_norm,
            lr_warmup_steps=self.lr_warmup_steps,
        )


@dataclass(frozen=True)
class RegularizerConfig:
    """KL-to-reference loss term and entropy bonus added to the policy loss."""

    kl_coef: float = 0.0  # > 0 needs ref_logp_bt in the batch
    kl_type: str = "k3"
    entropy_coef: float = 0.0


def token_logprobs(logits_btv: torch.Tensor, input_ids_bt: torch.Tensor) -> torch.Tensor:
    """log p(token_t | tokens_<t), aligned with input_ids (position 0 is 0)."""
    logp_btv = F.log_softmax(logits_btv[:, :-1].float(), dim=-1)
    logp_bt = logp_btv.gather(-1, input_ids_bt[:, 1:].unsqueeze(-1)).squeeze(-1)
    return F.pad(logp_bt, (1, 0))


class FSDPEngine:
    def __init__(self, cfg: FSDPEngineConfig, rank: int, world_size: int, init_method: str):
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.device = init_distributed(cfg.device, cfg.backend, rank, world_size, init_method)
        model = AutoModelForCausalLM.from_pretrained(cfg.model_path, dtype=DTYPES[cfg.dtype])
        model.to(self.device)  # type: ignore[arg-type]
        if not cfg.trainable:
            model.requires_grad_(False)
        shard(model, model.model.layers)
        self.model = model
        self.updater = (
            Updater(model, cfg.optim(), world_size, cfg.micro_batch_size) if cfg.trainable else None
        )
        self.num_params = sum(p.numel() for p in model.parameters())

    # -- forward passes -------------------------------------------------------
    def _logits(self, mb: TrajectoryBatch, temperature: float) -> torch.Tensor:
        ids = mb.input_ids_bt.to(self.device)
        mask = mb.attention_mask_bt.to(self.device)
        logits = self.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        return logits.float() / temperature

    @torch.no_grad()
    def logprobs(self, batch: TrajectoryBatch, temperature: float = 1.0) -> torch.Tensor:
        """Log-probs (b, t) of this rank's batch under the current weights (0 off the response)."""
        self.model.eval()
        out = torch.zeros(batch.input_ids_bt.shape, dtype=torch.float32)
        start = 0
        for mb in micro_batches(batch, self.cfg.micro_batch_size):
            ids = mb.input_ids_bt.to(self.device)
            logp = token_logprobs(self._logits(mb, temperature), ids).cpu()
            out[start : start + len(mb), : logp.shape[1]] = logp
            start += len(mb)
        return out * batch.response_mask_bt

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
            hit_bt = self._logits(mb, 1.0)[:, :-1].argmax(-1) == ids[:, 1:]
            resp_bt = mb.response_mask_bt[:, 1:].to(self.device).bool()
            out.append((hit_bt | ~resp_bt).all(dim=1).cpu())
        return torch.cat(out)

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
    ) -> dict[str, float]:
        """Policy-gradient update on this rank's share; returns global metrics."""
        if batch.old_logp_bt is None or batch.advantages_bt is None:
            raise ValueError("update_policy needs old_logp_bt and advantages_bt in the batch")
        reg = reg or RegularizerConfig()
        if reg.kl_coef > 0 and batch.ref_logp_bt is None:
            raise ValueError("a KL loss (kl_coef > 0) needs ref_logp_bt in the batch")
        policy_loss = POLICY_LOSSES[loss_cfg.name]

        def loss_fn(mb: TrajectoryBatch, norm: LossNorm):
            assert mb.old_logp_bt is not None and mb.advantages_bt is not None
            ids = mb.input_ids_bt.to(self.device)
            mask = mb.response_mask_bt.to(self.device).float()
            logits = self._logits(mb, temperature)
            logp = token_logprobs(logits, ids)
            loss, metrics = policy_loss(
                logp,
                mb.old_logp_bt.to(self.device),
                mb.advantages_bt.to(self.device),
                mask,
                loss_cfg,
                norm,
            )
            with torch.set_grad_enabled(reg.entropy_coef != 0):
                entropy = F.pad(entropy_from_logits(logits[:, :-1]), (1, 0))
            metrics["actor/entropy"] = float(masked_mean(entropy.detach(), mask))
            if reg.entropy_coef != 0:
                loss = loss - reg.entropy_coef * aggregate(entropy, mask, loss_cfg.agg, norm)
            if reg.kl_coef > 0:
                assert mb.ref_logp_bt is not None
                kl = kl_penalty(logp, mb.ref_logp_bt.to(self.device), reg.kl_type)
                kl_loss = aggregate(kl, mask, loss_cfg.agg, norm)
                loss = loss + reg.kl_coef * kl_loss
                metrics["actor/kl_loss"] = float(kl_loss.detach())
                metrics["actor/kl"] = float(masked_mean(kl.detach(), mask))
            return loss, metrics

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

    def update_sft(self, batch: TrajectoryBatch) -> dict[str, float]:
        """One supervised step: token-mean NLL of the response tokens."""

        def loss_fn(mb: TrajectoryBatch, norm: LossNorm):
            ids = mb.input_ids_bt.to(self.device)
            logp = token_logprobs(self._logits(mb, 1.0), ids)
            return sft_loss(logp, mb.response_mask_bt.to(self.device).float(), norm)

        return self._updater().step(batch, loss_fn, 1.0, "sft")

    # -- weights --------------------------------------------------------------
    def named_weights(self) -> list[tuple[str, torch.Tensor]] | None:
        """Full HF-named weights on rank 0 (None elsewhere). Collective: call on every rank."""
        out = []
        for name, tensor in self.model.state_dict().items():
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            if self.rank == 0:
                out.append((name, full.detach().cpu()))
        return out if self.rank == 0 else None

    def save_hf(self, out_dir: str, tokenizer_dir: str | None = None) -> str | None:
        """Write the policy as an HF model directory (atomically, rank 0). Collective."""
        weights = self.named_weights()
        if self.rank != 0:
            return None
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        assert weights is not None
        out = Path(out_dir)
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        config = AutoConfig.from_pretrained(self.cfg.model_path)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        model.load_state_dict(dict(weights), assign=True, strict=False)
        model.tie_weights()
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(tokenizer_dir or self.cfg.model_path).save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
        return str(out)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
