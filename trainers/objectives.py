"""The training objectives a policy engine minimises, as functions of per-token tensors.

Legend: b = samples, t = tokens.

An engine computes log-probs (and entropies) of a micro-batch its own way
(FSDP2, Megatron with tensor or pipeline parallelism) and hands them here, so
every engine optimises the same loss, term for term.
"""

from __future__ import annotations

import torch

from algos import (
    POLICY_LOSSES,
    LossNorm,
    PolicyLossConfig,
    aggregate,
    kl_penalty,
    masked_mean,
)
from trainers.batch import TrajectoryBatch
from trainers.fsdp.engine import RegularizerConfig


def check_policy_batch(batch: TrajectoryBatch, reg: RegularizerConfig) -> None:
    if batch.old_logp_bt is None or batch.advantages_bt is None:
        raise ValueError("update_policy needs old_logp_bt and advantages_bt in the batch")
    if reg.kl_coef > 0 and batch.ref_logp_bt is None:
        raise ValueError("a KL loss (kl_coef > 0) needs ref_logp_bt in the batch")


def policy_objective(
    logp_bt: torch.Tensor,
    entropy_bt: torch.Tensor,
    mb: TrajectoryBatch,
    loss_cfg: PolicyLossConfig,
    reg: RegularizerConfig,
    norm: LossNorm,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Policy loss of one micro-batch (its share of the global-batch loss) and its metrics.

    ``logp_bt`` and ``entropy_bt`` are the current policy's, on the device of the
    loss; the batch's tensors are moved there. The entropy term is
    ``-entropy_coef * H`` and the KL term ``+kl_coef * KL(pi || ref)``, both
    aggregated like the policy loss (``loss_cfg.agg``).
    """
    assert mb.old_logp_bt is not None and mb.advantages_bt is not None
    device = logp_bt.device
    mask_bt = mb.response_mask_bt.to(device).float()
    loss, metrics = POLICY_LOSSES[loss_cfg.name](
        logp_bt,
        mb.old_logp_bt.to(device),
        mb.advantages_bt.to(device),
        mask_bt,
        loss_cfg,
        norm,
    )
    metrics["actor/entropy"] = float(masked_mean(entropy_bt.detach(), mask_bt))
    if reg.entropy_coef != 0:
        loss = loss - reg.entropy_coef * aggregate(entropy_bt, mask_bt, loss_cfg.agg, norm)
    if reg.kl_coef > 0:
        assert mb.ref_logp_bt is not None
        kl_bt = kl_penalty(logp_bt, mb.ref_logp_bt.to(device), reg.kl_type)
        kl_loss = aggregate(kl_bt, mask_bt, loss_cfg.agg, norm)
        loss = loss + reg.kl_coef * kl_loss
        metrics["actor/kl_loss"] = float(kl_loss.detach())
        metrics["actor/kl"] = float(masked_mean(kl_bt.detach(), mask_bt))
    return loss, metrics
