"""FSDP2 critic engine for PPO: the policy's transformer with a scalar value head.

Legend: b = samples, t = tokens, h = hidden size.

Values are aligned like log-probs: ``values_bt[:, t]`` is V(state before token
t), read from the hidden state at position t-1, so the value of each response
token's state sits under that token's mask entry.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from rlpost.algos import LossNorm, clipped_value_loss
from rlpost.trainers.batch import TrajectoryBatch
from rlpost.trainers.fsdp.common import (
    DTYPES,
    Updater,
    init_distributed,
    micro_batches,
    run_epochs,
    shard,
)
from rlpost.trainers.fsdp.engine import FSDPEngineConfig
from rlpost.trainers.objectives import critic_metrics


class ValueModel(torch.nn.Module):
    """A transformer body (from the policy checkpoint) and a zero-initialised value head."""

    def __init__(self, body: torch.nn.Module, hidden_size: int):
        super().__init__()
        self.body = body
        self.value_head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h_bth = self.body(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state
        v_bt = self.value_head(h_bth.float()).squeeze(-1)
        return F.pad(v_bt[:, :-1], (1, 0))


class CriticEngine:
    def __init__(self, cfg: FSDPEngineConfig, rank: int, world_size: int, init_method: str):
        from transformers import AutoModel

        torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.device = init_distributed(cfg.device, cfg.backend, rank, world_size, init_method)
        cfg.check()
        body = AutoModel.from_pretrained(cfg.model_path, dtype=DTYPES[cfg.dtype])
        if cfg.gradient_checkpointing:
            body.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        model = ValueModel(body, body.config.hidden_size).to(self.device)
        shard(model, body.layers, offload=cfg.param_offload, mixed_precision=cfg.mixed_precision)
        self.model = model
        # The critic always runs padded; a token budget still shapes its micro-batches.
        self.updater = Updater(model, cfg.optim(), world_size, self._micro_batches)
        self.num_params = sum(p.numel() for p in model.parameters())

    def _micro_batches(self, batch: TrajectoryBatch) -> list[TrajectoryBatch]:
        return micro_batches(batch, self.cfg.micro_batch_size, self.cfg.micro_batch_tokens)

    @torch.no_grad()
    def values(self, batch: TrajectoryBatch) -> torch.Tensor:
        """V (b, t) of this rank's batch, 0 off the response mask."""
        self.model.eval()
        out = torch.zeros(batch.input_ids_bt.shape, dtype=torch.float32)
        start = 0
        for mb in self._micro_batches(batch):
            v = self.model(mb.input_ids_bt.to(self.device), mb.attention_mask_bt.to(self.device))
            out[start : start + len(mb), : v.shape[1]] = v.cpu()
            start += len(mb)
        return out * batch.response_mask_bt

    def update_critic(
        self,
        batch: TrajectoryBatch,
        *,
        value_clip: float,
        agg: str,
        epochs: int = 1,
        mini_batches: int = 1,
    ) -> dict[str, float]:
        """Clipped value regression onto ``returns_bt`` (batch.old_values_bt are the
        values at sampling time). Returns global metrics."""
        if batch.returns_bt is None or batch.old_values_bt is None:
            raise ValueError("update_critic needs returns_bt and old_values_bt in the batch")

        def loss_fn(mb: TrajectoryBatch, norm: LossNorm):
            assert mb.returns_bt is not None and mb.old_values_bt is not None
            v = self.model(mb.input_ids_bt.to(self.device), mb.attention_mask_bt.to(self.device))
            return clipped_value_loss(
                v,
                mb.old_values_bt.to(self.device),
                mb.returns_bt.to(self.device),
                mb.response_mask_bt.to(self.device).float(),
                clip=value_clip,
                agg=agg,
                norm=norm,
            )

        start = time.perf_counter()
        out = run_epochs(
            lambda mini: self.updater.step(mini, loss_fn, 1.0, "critic"),
            batch,
            epochs,
            mini_batches,
        )
        out.update(critic_metrics(batch))
        out["timing/critic_update_s"] = time.perf_counter() - start
        return out

    def save_checkpoint(self, path: str) -> str:
        """Sharded model, optimizer, LR schedule and RNG states, atomically. Collective."""
        from rlpost.trainers.fsdp.state import save_engine

        u = self.updater
        save_engine(
            path, self.model, u.optimizer, u.scheduler, self.cfg, self.rank, self.world_size, False
        )
        return str(path)

    def load_checkpoint(self, path: str) -> None:
        from rlpost.trainers.fsdp.state import load_engine

        load_engine(
            path, self.model, self.updater.optimizer, self.updater.scheduler, self.rank, False
        )

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
