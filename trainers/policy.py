"""A policy engine's log-probs, updates and checkpoints, written once for every
training backend.

Legend: b = samples, t = tokens.

A backend engine (``FSDPEngine``, ``MegatronEngine``) builds its model and hands
this class three small objects: the ``Backend`` that runs forward passes and the
optimizer, the function that turns a micro-batch's model output into log-probs
and entropies, and its ``CheckpointState``. The losses are
``rlpost.trainers.objectives`` (the ``algos`` functions), so every backend
optimises the same loss, term for term.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import torch

from rlpost.algos import LossNorm, OffPolicyConfig, PolicyLossConfig, PreferenceConfig, sft_loss
from rlpost.runtime.device import upload
from rlpost.trainers import checkpointing
from rlpost.trainers.batch import TrajectoryBatch
from rlpost.trainers.checkpointing import CheckpointState
from rlpost.trainers.objectives import RegularizerConfig, check_policy_batch, policy_objective
from rlpost.trainers.preference import preference_loss
from rlpost.trainers.update import Backend, MicroLoss, run_epochs, step


class TokenStats(Protocol):
    def __call__(
        self, mb: TrajectoryBatch, output: torch.Tensor, temperature: float, with_entropy: bool, /
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (b, t) of ``mb``'s tokens from the model's ``output`` and, if
        ``with_entropy``, the entropy (b, t) of each position's prediction (else None
        or zeros); position 0 is 0 in both."""
        ...


class PolicyUpdates:
    """The policy engine's shared part (``rlpost.trainers.engine.PolicyEngine``)."""

    def __init__(self, backend: Backend, token_stats: TokenStats, state: CheckpointState):
        self.backend, self.token_stats, self.state = backend, token_stats, state

    @contextmanager
    def adapter_off(self, disable: bool) -> Iterator[None]:
        """Score with the base model while the block runs (LoRA engines override it)."""
        if disable:
            raise ValueError("disable_adapter=True needs a LoRA engine (lora.rank > 0)")
        yield

    # -- log-probs ----------------------------------------------------------------------
    @torch.no_grad()
    def logprobs(
        self, batch: TrajectoryBatch, temperature: float = 1.0, disable_adapter: bool = False
    ) -> torch.Tensor:
        """Log-probs (b, t) of this rank's batch under the current weights (0 off the response).

        ``disable_adapter=True`` (LoRA only) scores with the base model, i.e. the
        frozen reference policy of a KL term, without a second copy of the model.
        """

        def collect(mb: TrajectoryBatch, output: torch.Tensor):
            return torch.zeros(()), self.token_stats(mb, output, temperature, False)[0]

        with self.adapter_off(disable_adapter):
            logp_bt = self.backend.forward(batch, collect, grad=False)
        return logp_bt * batch.response_mask_bt

    def ref_logprobs(self, batch: TrajectoryBatch, temperature: float = 1.0) -> torch.Tensor:
        """Reference-policy log-probs of a LoRA engine: the base model, adapter disabled."""
        return self.logprobs(batch, temperature, disable_adapter=True)

    # -- updates ------------------------------------------------------------------------
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
        """Policy-gradient update on this rank's share; returns global metrics.

        With ``rollout_logp_bt`` in the batch, each token's advantage is scaled by the
        weight of the ``off_policy`` correction; ``is_cap`` alone is token_is at that cap,
        min(pi_old / pi_rollout, is_cap).
        """
        if batch.old_logp_bt is None:
            raise ValueError(
                "update_policy needs old_logp_bt in the batch (update_policy_single_pass "
                "takes the old log-probs from its own forward)"
            )
        loss_fn = self._policy_loss(
            batch, loss_cfg, temperature, reg, is_cap, off_policy, own_old=False
        )
        start = time.perf_counter()
        out = run_epochs(
            lambda mini: step(self.backend, mini, loss_fn, norm_const, "actor")[0],
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
        off_policy: OffPolicyConfig | None = None,
    ) -> tuple[dict[str, float], torch.Tensor]:
        """One optimizer step over the whole batch (one epoch, one mini-batch) whose old
        log-probs are the update's own, detached: the weights have not changed since
        sampling, so ``update_policy`` after a ``logprobs`` call would compute the
        same loss and gradient with one forward pass more.

        Returns the metrics and those log-probs (b, t) as ``logprobs`` returns them
        (0 off the response), e.g. for the rollout parity check. The batch's own
        ``old_logp_bt`` is ignored.
        """
        loss_fn = self._policy_loss(
            batch, loss_cfg, temperature, reg, is_cap, off_policy, own_old=True
        )
        start = time.perf_counter()
        out, logp_bt = step(self.backend, batch, loss_fn, norm_const, "actor")
        out["timing/update_s"] = time.perf_counter() - start
        return out, logp_bt * batch.response_mask_bt

    def _policy_loss(
        self,
        batch: TrajectoryBatch,
        loss_cfg: PolicyLossConfig,
        temperature: float,
        reg: RegularizerConfig | None,
        is_cap: float | None,
        off_policy: OffPolicyConfig | None,
        own_old: bool,
    ) -> MicroLoss:
        """The micro-batch loss of a policy update. ``own_old`` False: the old log-probs
        come from the batch; True: they are the forward's own, detached, and handed
        back as the micro-batch's rows."""
        reg = reg or RegularizerConfig()
        check_policy_batch(batch, reg)

        def loss_fn(mb: TrajectoryBatch, output: torch.Tensor, norm: LossNorm):
            logp, entropy = self.token_stats(mb, output, temperature, True)
            assert entropy is not None
            if reg.entropy_coef == 0:  # a metric only
                entropy = entropy.detach()
            if own_old:
                old_logp = logp.detach()
            else:
                assert mb.old_logp_bt is not None
                old_logp = upload(mb.old_logp_bt, logp.device)
            loss, metrics = policy_objective(
                logp, entropy, old_logp, mb, loss_cfg, reg, norm, is_cap, off_policy
            )
            return loss, metrics, old_logp if own_old else None

        return loss_fn

    def update_sft(self, batch: TrajectoryBatch) -> dict[str, float]:
        """One supervised step: token-mean NLL of the response tokens."""

        def loss_fn(mb: TrajectoryBatch, output: torch.Tensor, norm: LossNorm):
            logp = self.token_stats(mb, output, 1.0, False)[0]
            loss, metrics = sft_loss(logp, upload(mb.response_mask_bt, logp.device).float(), norm)
            return loss, metrics, None

        return step(self.backend, batch, loss_fn, 1.0, "sft")[0]

    def update_preference(self, batch: TrajectoryBatch, cfg: PreferenceConfig) -> dict[str, float]:
        """One optimizer step of a preference loss (``algo=dpo``) over pairs laid out by
        ``rlpost.data.preference.preference_batch``; the reference policy's log-probs,
        where the loss needs them, are the batch's ``scores_b["ref_logps"]``. Returns
        global metrics (``dpo/loss``, ``rewards/*``, ``logps/*``). Collective."""
        start = time.perf_counter()
        loss_fn = preference_loss(lambda mb, out: self.token_stats(mb, out, 1.0, False)[0], cfg)
        out = step(self.backend, batch, loss_fn, 1.0, "dpo")[0]
        out["timing/update_s"] = time.perf_counter() - start
        return out

    # -- checkpoints --------------------------------------------------------------------
    def save_checkpoint(self, path: str) -> str:
        """Write the model (the adapter only, under LoRA), optimizer, LR schedule and RNG
        states to ``path``, atomically (``rlpost.trainers.checkpointing``). Collective."""
        return checkpointing.save(path, self.state)

    def load_checkpoint(self, path: str) -> None:
        """Restore ``save_checkpoint``'s state into this freshly built engine, which must
        be built with the same model path and LoRA settings. Collective."""
        checkpointing.load(path, self.state)
