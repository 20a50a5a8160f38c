"""Megatron-core critic engine for PPO: the policy's transformer with a scalar value
head, split over tensor, pipeline and data-parallel ranks as the policy is.

Legend: b = samples, t = tokens.

Values, updates and checkpoints are ``rlpost.trainers.critic``'s, shared with
the FSDP2 ``CriticEngine``, and so are the numbers: values are aligned like
log-probs (``values_bt[:, t]`` is V(state before token t), read from the hidden
state at position t-1), the head is zero-initialised, and the loss is
``algos.clipped_value_loss`` with the same global normalisation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlpost.trainers.critic import CriticUpdates
from rlpost.trainers.megatron import cpu_shim
from rlpost.trainers.megatron.checkpoint import MegatronState
from rlpost.trainers.megatron.config import MegatronEngineConfig
from rlpost.trainers.megatron.model import MegatronModel


def _values(output_bt1: torch.Tensor) -> torch.Tensor:
    """The value head's (b, t, 1) output -> V (b, t): position t gets the value read
    at t-1, position 0 gets 0."""
    return F.pad(output_bt1[..., 0][:, :-1], (1, 0))


class MegatronCriticEngine(CriticUpdates):
    @cpu_shim.runs_on_cpu
    def __init__(self, cfg: MegatronEngineConfig, rank: int, world_size: int, init_method: str):
        if cfg.packing:
            raise ValueError("the critic runs padded: packing=False")
        self.m = MegatronModel(cfg, rank, world_size, init_method, value_head=True)
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.num_params = self.m.num_params
        super().__init__(self.m, _values, MegatronState(self.m))

    def gathered_state(self) -> dict[str, torch.Tensor] | None:
        """Full Megatron tensors (the value head's included) on rank 0. Collective."""
        return self.m.gathered_state()

    def close(self) -> None:
        self.m.close()
