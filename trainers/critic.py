"""A PPO critic engine's values, updates and checkpoints, written once for every
training backend.

Legend: b = samples, t = tokens.

Values are aligned like log-probs: ``values_bt[:, t]`` is V(state before token
t), read from the hidden state at position t-1, so the value of each response
token's state sits under that token's mask entry. A backend critic
(``CriticEngine``, ``MegatronCriticEngine``) builds the value model and hands
this class its ``Backend``, the function that reads V (b, t) from a
micro-batch's model output, and its ``CheckpointState``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from rlpost.algos import LossNorm, clipped_value_loss
from rlpost.runtime.device import upload
from rlpost.trainers import checkpointing
from rlpost.trainers.batch import TrajectoryBatch
from rlpost.trainers.checkpointing import CheckpointState
from rlpost.trainers.objectives import critic_metrics
from rlpost.trainers.update import Backend, run_epochs, step


class CriticUpdates:
    """The critic engine's shared part (``rlpost.trainers.engine.ValueEngine``)."""

    def __init__(
        self,
        backend: Backend,
        values_of: Callable[[torch.Tensor], torch.Tensor],
        state: CheckpointState,
    ):
        self.backend, self.values_of, self.state = backend, values_of, state

    @torch.no_grad()
    def values(self, batch: TrajectoryBatch) -> torch.Tensor:
        """V (b, t) of this rank's batch, 0 off the response mask."""

        def collect(mb: TrajectoryBatch, output: torch.Tensor):
            return torch.zeros(()), self.values_of(output)

        return self.backend.forward(batch, collect, grad=False) * batch.response_mask_bt

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
        values at sampling time). Returns global metrics, and this rank's share of the
        values' fit to the returns (the worker group averages the ranks')."""
        if batch.returns_bt is None or batch.old_values_bt is None:
            raise ValueError("update_critic needs returns_bt and old_values_bt in the batch")

        def loss_fn(mb: TrajectoryBatch, output: torch.Tensor, norm: LossNorm):
            assert mb.returns_bt is not None and mb.old_values_bt is not None
            v_bt = self.values_of(output)
            loss, metrics = clipped_value_loss(
                v_bt,
                upload(mb.old_values_bt, v_bt.device),
                upload(mb.returns_bt, v_bt.device),
                upload(mb.response_mask_bt, v_bt.device).float(),
                clip=value_clip,
                agg=agg,
                norm=norm,
            )
            return loss, metrics, None

        start = time.perf_counter()
        out = run_epochs(
            lambda mini: step(self.backend, mini, loss_fn, 1.0, "critic")[0],
            batch,
            epochs,
            mini_batches,
        )
        out.update(critic_metrics(batch))
        out["timing/critic_update_s"] = time.perf_counter() - start
        return out

    # -- checkpoints --------------------------------------------------------------------
    def save_checkpoint(self, path: str) -> str:
        """Model, optimizer and RNG states, atomically. Collective."""
        return checkpointing.save(path, self.state)

    def load_checkpoint(self, path: str) -> None:
        """Restore ``save_checkpoint``'s state into this freshly built engine. Collective."""
        checkpointing.load(path, self.state)
