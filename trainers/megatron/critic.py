"""Megatron-core critic engine for PPO: the policy's transformer with a scalar value
head, split over tensor, pipeline and data-parallel ranks as the policy is.

Legend: b = samples, t = tokens.

The interface and the numbers are the FSDP2 ``CriticEngine``'s: values are
aligned like log-probs (``values_bt[:, t]`` is V(state before token t), read
from the hidden state at position t-1), the head is zero-initialised, and the
loss is ``algos.clipped_value_loss`` with the same global normalisation.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from rlpost.algos import clipped_value_loss
from rlpost.trainers.batch import TrajectoryBatch
from rlpost.trainers.fsdp.common import run_epochs
from rlpost.trainers.megatron import checkpoint, cpu_shim
from rlpost.trainers.megatron.config import MegatronEngineConfig
from rlpost.trainers.megatron.model import MegatronModel
from rlpost.trainers.megatron.schedule import dp_batch, rows_from_last_stage
from rlpost.trainers.objectives import critic_metrics


def _values(output_bt1: torch.Tensor) -> torch.Tensor:
    """The value head's (b, t, 1) output -> V (b, t): position t gets the value read
    at t-1, position 0 gets 0."""
    return F.pad(output_bt1[..., 0][:, :-1], (1, 0))


class MegatronCriticEngine:
    @cpu_shim.runs_on_cpu
    def __init__(self, cfg: MegatronEngineConfig, rank: int, world_size: int, init_method: str):
        if cfg.packing:
            raise ValueError("the critic runs padded: packing=False")
        self.m = MegatronModel(cfg, rank, world_size, init_method, value_head=True)
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.num_params = self.m.num_params

    @cpu_shim.runs_on_cpu
    @torch.no_grad()
    def values(self, batch: TrajectoryBatch) -> torch.Tensor:
        """V (b, t) of this rank's batch, 0 off the response mask."""
        m = self.m
        m.eval()
        data, mine = dp_batch(batch, m.mpu)
        mbs = m.micro_batches(data)
        results = m.run(mbs, lambda mb, out: (torch.zeros(()), _values(out)))
        out = rows_from_last_stage(mbs, results, data.input_ids_bt.shape, m.mpu, m.cfg.parallel.pp)
        return out[mine] * batch.response_mask_bt

    @cpu_shim.runs_on_cpu
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

        def loss_fn(mb, output, norm):
            return clipped_value_loss(
                _values(output),
                mb.old_values_bt,
                mb.returns_bt,
                mb.response_mask_bt.float(),
                clip=value_clip,
                agg=agg,
                norm=norm,
            )

        start = time.perf_counter()
        out = run_epochs(
            lambda mini: self.m.step(mini, loss_fn, 1.0, "critic")[0],
            batch,
            epochs,
            mini_batches,
        )
        # This rank's share, as the FSDP critic reports it (the worker group averages them).
        out.update(critic_metrics(batch))
        out["timing/critic_update_s"] = time.perf_counter() - start
        return out

    def gathered_state(self) -> dict[str, torch.Tensor] | None:
        """Full Megatron tensors (the value head's included) on rank 0. Collective."""
        return self.m.gathered_state()

    @cpu_shim.runs_on_cpu
    def save_checkpoint(self, path: str) -> str:
        """``rlpost.trainers.megatron.checkpoint.save``. Collective."""
        return checkpoint.save(self.m, path)

    @cpu_shim.runs_on_cpu
    def load_checkpoint(self, path: str) -> None:
        """``rlpost.trainers.megatron.checkpoint.load`` into this freshly built engine. Collective."""
        checkpoint.load(self.m, path)

    def close(self) -> None:
        self.m.close()
