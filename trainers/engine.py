"""What a training engine is to the worker shell and the controller: one protocol
for a policy, one for a PPO critic, one for a reward model. FSDP2 and Megatron
engines satisfy them alike (``rlpost.trainers.registry`` names them), so their
callers do not know which one they hold. The worker group's proxies
(``rlpost.workers.trainer_worker.TrainerGroup``) are built from these methods, so
a call through the group is checked against them.

``WeightSource`` is the capability the weight syncs need of an engine (every
policy engine has it); the worker shell checks for it once, when it builds the
engine.

Legend: b = samples, t = tokens.

Every call is made on every rank with that rank's share of the batch; calls
marked collective join the other ranks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

import torch

from rlpost.algos import OffPolicyConfig, PolicyLossConfig, PreferenceConfig
from rlpost.trainers.batch import TrajectoryBatch
from rlpost.trainers.distributed import Empty, new_tensor
from rlpost.trainers.objectives import RegularizerConfig

Specs = list[tuple[str, tuple[int, ...], torch.dtype]]  # names, shapes, dtypes


@runtime_checkable
class WeightSource(Protocol):
    """An engine whose full weights can leave it: at once, or a layer at a time."""

    rank: int
    device: torch.device

    def named_weights(self, merged: bool = True) -> list[tuple[str, torch.Tensor]] | None:
        """Full weights under the checkpoint's names on rank 0, None elsewhere. Collective."""
        ...

    def weight_stream(
        self, empty: Empty = new_tensor
    ) -> tuple[Specs, Iterator[tuple[str, torch.Tensor]]]:
        """``named_weights`` a layer at a time: every tensor's name, shape and dtype,
        and an iterator every rank runs to its end (the tensors reach rank 0).
        ``empty``: the memory each gathered tensor is put in. Collective."""
        ...


class PolicyEngine(WeightSource, Protocol):
    """A policy: log-probs, updates, weight export, checkpoints."""

    num_params: int

    def logprobs(self, batch: TrajectoryBatch, temperature: float = 1.0) -> torch.Tensor:
        """Log-probs (b, t) under the current weights, 0 off the response."""
        ...

    def ref_logprobs(self, batch: TrajectoryBatch, temperature: float = 1.0) -> torch.Tensor:
        """A LoRA policy's base-model log-probs (b, t): the reference policy."""
        ...

    def greedy_match(self, batch: TrajectoryBatch) -> torch.Tensor:
        """(b,) bool: every response token is the argmax given the tokens before it."""
        ...

    def has_dropout(self) -> bool: ...

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
        off_policy: OffPolicyConfig | None = None,
    ) -> dict[str, float]:
        """Policy-gradient update; global metrics. Collective."""
        ...

    def update_policy_single_pass(
        self,
        batch: TrajectoryBatch,
        loss_cfg: PolicyLossConfig,
        *,
        temperature: float = 1.0,
        norm_const: float = 1.0,
        reg: RegularizerConfig | None = None,
        is_cap: float | None = None,
        off_policy: OffPolicyConfig | None = None,
    ) -> tuple[dict[str, float], torch.Tensor]:
        """One step whose old log-probs are its own; metrics and those log-probs (b, t)."""
        ...

    def update_sft(self, batch: TrajectoryBatch) -> dict[str, float]: ...

    def update_preference(self, batch: TrajectoryBatch, cfg: PreferenceConfig) -> dict[str, float]:
        """One preference-loss step over interleaved (chosen, rejected) pairs. Collective."""
        ...

    def adapter_weights(self) -> tuple[dict[str, torch.Tensor], dict[str, object]] | None:
        """A LoRA adapter ``(tensors, peft_config)`` on rank 0 (the config as
        ``adapter_config.json`` holds it). Collective."""
        ...

    def save_hf(self, out_dir: str, tokenizer_dir: str | None = None) -> str | None:
        """An HF model directory, written by rank 0. Collective."""
        ...

    def save_checkpoint(self, path: str) -> str: ...

    def load_checkpoint(self, path: str) -> None: ...

    def close(self) -> None: ...


class ValueEngine(Protocol):
    """A PPO critic: values, clipped value regression, checkpoints."""

    num_params: int

    def values(self, batch: TrajectoryBatch) -> torch.Tensor:
        """V (b, t), 0 off the response."""
        ...

    def update_critic(
        self,
        batch: TrajectoryBatch,
        *,
        value_clip: float,
        agg: str,
        epochs: int = 1,
        mini_batches: int = 1,
    ) -> dict[str, float]: ...

    def save_checkpoint(self, path: str) -> str: ...

    def load_checkpoint(self, path: str) -> None: ...

    def close(self) -> None: ...


class RewardEngine(Protocol):
    """A Bradley-Terry reward model (``algo=rm``): rewards, updates, checkpoints."""

    num_params: int

    def rewards(self, batch: TrajectoryBatch) -> torch.Tensor:
        """r (b,) of this rank's samples."""
        ...

    def update_reward_model(
        self, batch: TrajectoryBatch, *, center_coef: float = 0.0
    ) -> dict[str, float]:
        """One step over interleaved (chosen, rejected) pairs; global metrics. Collective."""
        ...

    def has_dropout(self) -> bool: ...

    def save_hf(self, out_dir: str, tokenizer_dir: str | None = None) -> str | None: ...

    def save_checkpoint(self, path: str) -> str: ...

    def load_checkpoint(self, path: str) -> None: ...

    def close(self) -> None: ...
