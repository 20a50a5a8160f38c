"""The training objectives a policy engine minimises, as functions of per-token tensors.

Legend: b = samples, t = tokens.

An engine computes log-probs (and entropies) of a micro-batch its own way
(FSDP2, Megatron with tensor or pipeline parallelism) and hands them here, so
every engine optimises the same loss, term for term.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlpost.algos import (
    POLICY_LOSSES,
    LossNorm,
    Metrics,
    OffPolicyConfig,
    PolicyLossConfig,
    aggregate,
    build_off_policy,
    explained_variance,
    kl_penalty,
    masked_mean,
)
from rlpost.runtime.device import upload
from rlpost.trainers.batch import TrajectoryBatch


@dataclass(frozen=True)
class RegularizerConfig:
    """KL-to-reference loss term and entropy bonus added to the policy loss."""

    kl_coef: float = 0.0  # > 0 needs ref_logp_bt in the batch
    kl_type: str = "k3"
    entropy_coef: float = 0.0


def check_policy_batch(batch: TrajectoryBatch, reg: RegularizerConfig) -> None:
    if batch.advantages_bt is None:
        raise ValueError("a policy update needs advantages_bt in the batch")
    if reg.kl_coef > 0 and batch.ref_logp_bt is None:
        raise ValueError("a KL loss (kl_coef > 0) needs ref_logp_bt in the batch")


def policy_objective(
    logp_bt: torch.Tensor,
    entropy_bt: torch.Tensor,
    old_logp_bt: torch.Tensor,
    mb: TrajectoryBatch,
    loss_cfg: PolicyLossConfig,
    reg: RegularizerConfig,
    norm: LossNorm,
    is_cap: float | None = None,
    off_policy: OffPolicyConfig | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """Policy loss of one micro-batch (its share of the global-batch loss) and its metrics.

    ``logp_bt`` and ``entropy_bt`` are the current policy's, ``old_logp_bt`` the
    sampling-time policy's (the batch's, or the forward's own detached), all on
    the device of the loss; the batch's tensors are moved there. With rollout
    log-probs in the batch, each token's advantage is scaled by the weight of the
    ``off_policy`` correction (``rlpost.algos.off_policy``); ``is_cap`` alone is
    token_is at that cap, min(pi_old / pi_rollout, is_cap). The entropy
    term is ``-entropy_coef * H`` and the KL term ``+kl_coef * KL(pi || ref)``,
    both aggregated like the policy loss (``loss_cfg.agg``).
    """
    assert mb.advantages_bt is not None
    device = logp_bt.device
    mask_bt = upload(mb.response_mask_bt, device).float()
    adv_bt = upload(mb.advantages_bt, device)
    metrics: Metrics = {}
    if off_policy is None and is_cap is not None:
        off_policy = OffPolicyConfig("token_is", is_cap=is_cap)
    if off_policy is not None and mb.rollout_logp_bt is not None:
        # Scaling A_t by w_t >= 0 scales that token's clipped PPO term by w_t.
        w_bt, metrics = build_off_policy(off_policy)(
            logp_bt, old_logp_bt, upload(mb.rollout_logp_bt, device), mask_bt, adv_bt, off_policy
        )
        adv_bt = adv_bt * w_bt
        if off_policy.name == "token_is":  # the names these figures have always had
            metrics["rollout/is_weight_mean"] = metrics["off_policy/is_mean"]
            metrics["rollout/is_capped_frac"] = metrics["off_policy/clipped_frac"]
    loss, pg_metrics = POLICY_LOSSES[loss_cfg.name](
        logp_bt, old_logp_bt, adv_bt, mask_bt, loss_cfg, norm
    )
    metrics.update(pg_metrics)
    metrics["actor/entropy"] = masked_mean(entropy_bt.detach(), mask_bt)
    if reg.entropy_coef != 0:
        loss = loss - reg.entropy_coef * aggregate(entropy_bt, mask_bt, loss_cfg.agg, norm)
    if reg.kl_coef > 0:
        assert mb.ref_logp_bt is not None
        kl_bt = kl_penalty(logp_bt, upload(mb.ref_logp_bt, device), reg.kl_type)
        kl_loss = aggregate(kl_bt, mask_bt, loss_cfg.agg, norm)
        loss = loss + reg.kl_coef * kl_loss
        metrics["actor/kl_loss"] = kl_loss.detach()
        metrics["actor/kl"] = masked_mean(kl_bt.detach(), mask_bt)
    return loss, metrics


def critic_metrics(batch: TrajectoryBatch) -> dict[str, float]:
    """How well the values before an update explain the returns, and their means
    over this rank's response tokens (the worker group averages the ranks')."""
    assert batch.old_values_bt is not None and batch.returns_bt is not None
    mask = batch.response_mask_bt.float()
    count = mask.sum().clamp(min=1)
    return {
        "critic/vf_explained_var": float(
            explained_variance(batch.old_values_bt, batch.returns_bt, mask)
        ),
        "critic/values_mean": float((batch.old_values_bt * mask).sum() / count),
        "critic/returns_mean": float((batch.returns_bt * mask).sum() / count),
    }
