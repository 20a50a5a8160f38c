"""FSDP2 training engine: log-probs, policy/SFT updates, HF-named weight export.

Legend: b = samples, t = tokens, v = vocab.

One engine object lives in each rank's process; ranks join one process group
(gloo on CPU, NCCL on CUDA, HCCL on Ascend) and shard the model with
``fully_shard``. Every rank receives its own share of the batch; loss
normalisers are global counts (all-reduced), so the gradient does not depend
on how the batch was split over ranks and micro-batches.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from algos import POLICY_LOSSES, LossNorm, PolicyLossConfig, sft_loss
from trainers.batch import TrajectoryBatch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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


# Metrics that are this micro-batch's share of the global loss: summed, not averaged.
SUMMED_METRICS = frozenset({"actor/pg_loss"})


def token_logprobs(logits_btv: torch.Tensor, input_ids_bt: torch.Tensor) -> torch.Tensor:
    """log p(token_t | tokens_<t), aligned with input_ids (position 0 is 0)."""
    logp_btv = F.log_softmax(logits_btv[:, :-1].float(), dim=-1)
    logp_bt = logp_btv.gather(-1, input_ids_bt[:, 1:].unsqueeze(-1)).squeeze(-1)
    return F.pad(logp_bt, (1, 0))


class FSDPEngine:
    def __init__(self, cfg: FSDPEngineConfig, rank: int, world_size: int, init_method: str):
        from torch.distributed.fsdp import fully_shard
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        if cfg.device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        self.device = torch.device(cfg.device)
        if not dist.is_initialized():
            dist.init_process_group(
                cfg.backend, init_method=init_method, rank=rank, world_size=world_size
            )
        model = AutoModelForCausalLM.from_pretrained(cfg.model_path, dtype=DTYPES[cfg.dtype])
        model.to(self.device)  # type: ignore[arg-type]
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        self.model = model
        self.optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=cfg.lr,
            betas=cfg.betas,
            weight_decay=cfg.weight_decay,
        )
        warmup = max(cfg.lr_warmup_steps, 0)
        # A fresh Adam moves every weight by ~lr on its first steps whatever the
        # gradient's size; a linear warm-up keeps that from wrecking a tuned model.
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / (warmup + 1))
        )
        self.num_params = sum(p.numel() for p in model.parameters())

    # -- forward passes -------------------------------------------------------
    def _forward_logp(self, mb: TrajectoryBatch, temperature: float) -> torch.Tensor:
        ids = mb.input_ids_bt.to(self.device)
        mask = mb.attention_mask_bt.to(self.device)
        logits = self.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        return token_logprobs(logits / temperature, ids)

    def _micro_batches(self, batch: TrajectoryBatch) -> list[TrajectoryBatch]:
        size = self.cfg.micro_batch_size
        return [batch.select(slice(i, i + size)).trim() for i in range(0, len(batch), size)]

    @torch.no_grad()
    def logprobs(self, batch: TrajectoryBatch, temperature: float = 1.0) -> torch.Tensor:
        """Log-probs (b, t) of this rank's batch under the current weights."""
        self.model.eval()
        out = torch.zeros(batch.input_ids_bt.shape, dtype=torch.float32)
        for start in range(0, len(batch), self.cfg.micro_batch_size):
            mb = batch.select(slice(start, start + self.cfg.micro_batch_size)).trim()
            logp = self._forward_logp(mb, temperature).cpu()
            out[start : start + len(mb), : logp.shape[1]] = logp
        return out * batch.response_mask_bt

    @torch.no_grad()
    def greedy_match(self, batch: TrajectoryBatch) -> torch.Tensor:
        """(b,) bool: every response token is the argmax given the tokens before it.

        Equivalent to "greedy decoding reproduces the response", at the cost of one
        forward pass; used to stop the built-in warm-up at a target accuracy.
        """
        self.model.eval()
        out = []
        for start in range(0, len(batch), self.cfg.micro_batch_size):
            mb = batch.select(slice(start, start + self.cfg.micro_batch_size)).trim()
            ids = mb.input_ids_bt.to(self.device)
            logits = self.model(
                input_ids=ids, attention_mask=mb.attention_mask_bt.to(self.device), use_cache=False
            ).logits
            hit_bt = logits[:, :-1].argmax(-1) == ids[:, 1:]
            resp_bt = mb.response_mask_bt[:, 1:].to(self.device).bool()
            out.append((hit_bt | ~resp_bt).all(dim=1).cpu())
        return torch.cat(out)

    # -- updates --------------------------------------------------------------
    def _global_norm(self, batch: TrajectoryBatch, norm_const: float) -> LossNorm:
        counts = torch.tensor(
            [float(batch.response_mask_bt.sum()), float(len(batch))], dtype=torch.float64
        )
        dist.all_reduce(counts)
        return LossNorm(
            global_tokens=max(counts[0].item(), 1.0),
            global_samples=max(counts[1].item(), 1.0),
            norm_const=norm_const,
        )

    def _step(
        self,
        batch: TrajectoryBatch,
        loss_fn: Callable[[TrajectoryBatch, torch.Tensor, LossNorm], tuple[torch.Tensor, dict]],
        temperature: float,
        norm_const: float,
    ) -> dict[str, float]:
        """One optimizer step over ``batch`` (this rank's share), accumulating micro-batches."""
        self.model.train()
        norm = self._global_norm(batch, norm_const)
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        loss_sum = 0.0
        for mb in self._micro_batches(batch):
            logp = self._forward_logp(mb, temperature)
            loss, metrics = loss_fn(mb, logp, norm)
            # FSDP averages gradients over ranks; the loss is already a global
            # mean, so undo the average.
            (loss * self.world_size).backward()
            loss_sum += float(loss.detach())
            weight = float(mb.response_mask_bt.sum())
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + float(v) * (1.0 if k in SUMMED_METRICS else weight)
        norm_t = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        grad_norm = float(norm_t.full_tensor() if hasattr(norm_t, "full_tensor") else norm_t)
        self.optimizer.step()
        lr = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        # Same numbers on every rank: sums over the global batch.
        keys = sorted(sums)
        totals = torch.tensor([sums[k] for k in keys] + [loss_sum], dtype=torch.float64)
        dist.all_reduce(totals)
        out = {
            k: totals[i].item() / (1.0 if k in SUMMED_METRICS else norm.global_tokens)
            for i, k in enumerate(keys)
        }
        out["actor/loss"] = totals[-1].item()
        out["actor/grad_norm"] = float(grad_norm)
        out["actor/lr"] = float(lr)
        return out

    def update_policy(
        self,
        batch: TrajectoryBatch,
        loss_cfg: PolicyLossConfig,
        *,
        temperature: float = 1.0,
        epochs: int = 1,
        mini_batches: int = 1,
        norm_const: float = 1.0,
    ) -> dict[str, float]:
        """Clipped policy-gradient update on this rank's share; returns averaged metrics."""
        if batch.old_logp_bt is None or batch.advantages_bt is None:
            raise ValueError("update_policy needs old_logp_bt and advantages_bt in the batch")
        policy_loss = POLICY_LOSSES[loss_cfg.name]

        def loss_fn(mb: TrajectoryBatch, logp: torch.Tensor, norm: LossNorm):
            assert mb.old_logp_bt is not None and mb.advantages_bt is not None
            return policy_loss(
                logp,
                mb.old_logp_bt.to(logp.device),
                mb.advantages_bt.to(logp.device),
                mb.response_mask_bt.to(logp.device).float(),
                loss_cfg,
                norm,
            )

        return self._run_epochs(batch, loss_fn, temperature, epochs, mini_batches, norm_const)

    def update_sft(self, batch: TrajectoryBatch) -> dict[str, float]:
        """One supervised step: token-mean NLL of the response tokens."""

        def loss_fn(mb: TrajectoryBatch, logp: torch.Tensor, norm: LossNorm):
            return sft_loss(logp, mb.response_mask_bt.to(logp.device).float(), norm)

        return self._run_epochs(batch, loss_fn, 1.0, 1, 1, 1.0)

    def _run_epochs(self, batch, loss_fn, temperature, epochs, mini_batches, norm_const):
        start = time.perf_counter()
        history: list[dict[str, float]] = []
        size = len(batch) // mini_batches
        for _ in range(epochs):
            for i in range(mini_batches):
                mini = batch.select(slice(i * size, (i + 1) * size))
                history.append(self._step(mini, loss_fn, temperature, norm_const))
        out = {k: sum(h[k] for h in history) / len(history) for k in history[0]}
        out["timing/update_s"] = time.perf_counter() - start
        return out

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
        config = AutoConfig.from_pretrained(self.cfg.model_path)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        model.load_state_dict(dict(weights), assign=True, strict=False)
        model.tie_weights()
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(tokenizer_dir or self.cfg.model_path).save_pretrained(tmp)
        if out.exists():
            import shutil

            shutil.rmtree(out)
        os.replace(tmp, out)
        return str(out)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
