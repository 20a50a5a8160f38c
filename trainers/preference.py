"""The micro-batch losses of the offline preference updates: DPO and its variants on
a policy, Bradley-Terry on a reward model.

Legend: b = samples, t = tokens, p = pairs.

A preference batch (``rlpost.data.preference.preference_batch``) interleaves each
pair's chosen (even rows) and rejected (odd rows) completions; batches are split
into contiguous even-sized shares and micro-batches, so every micro-batch holds
whole pairs. The losses are ``rlpost.algos.preference``'s; this module only cuts
the per-sample numbers into pairs and hands them the global pair count.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlpost.algos import (
    LossNorm,
    PreferenceConfig,
    bradley_terry_loss,
    build_preference_loss,
    sequence_logps,
    with_rpo_nll,
)
from rlpost.runtime.device import upload
from rlpost.trainers.batch import TrajectoryBatch
from rlpost.trainers.update import MicroLoss

# The reference policy's per-sample log-probs in ``scores_b`` (summed, or per-token
# means for a length-normalised loss), set by the controller before the update.
REF_LOGPS = "ref_logps"


def split_pairs(mb: TrajectoryBatch, values_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen_p, rejected_p) of a micro-batch's per-sample values."""
    if len(mb) % 2 or (
        mb.group_ids_b is not None and not torch.equal(mb.group_ids_b[0::2], mb.group_ids_b[1::2])
    ):
        raise ValueError(
            "a preference micro-batch must hold whole pairs (chosen, rejected interleaved); "
            "split batches by an even micro_batch_size, without a token budget"
        )
    return values_b[0::2], values_b[1::2]


def preference_loss(
    token_logps: Callable[[TrajectoryBatch, torch.Tensor], torch.Tensor], cfg: PreferenceConfig
) -> MicroLoss:
    """The micro-batch loss of a preference update; ``token_logps(mb, output)`` gives
    the policy's log-probs (b, t) with their graph."""
    spec = build_preference_loss(cfg)

    def loss_fn(mb: TrajectoryBatch, output: torch.Tensor, norm: LossNorm):
        logp_bt = token_logps(mb, output)
        mask_bt = upload(mb.response_mask_bt, logp_bt.device)
        chosen_p, rejected_p = split_pairs(
            mb, sequence_logps(logp_bt, mask_bt, spec.length_normalised)
        )
        ref_c = ref_r = None
        if spec.needs_reference:
            if REF_LOGPS not in mb.scores_b:
                raise ValueError(f"loss={cfg.loss} needs the reference log-probs in the batch")
            ref_c, ref_r = split_pairs(mb, upload(mb.scores_b[REF_LOGPS], logp_bt.device))
        pairs = norm.global_samples / 2
        loss, metrics = spec.fn(chosen_p, rejected_p, ref_c, ref_r, cfg, pairs)
        if cfg.rpo_alpha:
            mean_c = (
                chosen_p
                if spec.length_normalised
                else split_pairs(mb, sequence_logps(logp_bt, mask_bt, True))[0]
            )
            loss = with_rpo_nll(loss, metrics, mean_c, cfg, pairs)
        return loss, metrics, None

    return loss_fn


def reward_model_loss(
    rewards_of: Callable[[torch.Tensor], torch.Tensor], center_coef: float
) -> MicroLoss:
    """The micro-batch Bradley-Terry loss; ``rewards_of(output)`` gives r (b,) and the
    pair's margin is ``scores_b["margin"]`` (0 where the data has none)."""

    def loss_fn(mb: TrajectoryBatch, output: torch.Tensor, norm: LossNorm):
        r_b = rewards_of(output)
        chosen_p, rejected_p = split_pairs(mb, r_b)
        margin_p = None
        if "margin" in mb.scores_b:
            margin_p = upload(mb.scores_b["margin"], r_b.device)[0::2]
        loss, metrics = bradley_terry_loss(
            chosen_p, rejected_p, norm.global_samples / 2, margin_p, center_coef
        )
        return loss, metrics, None

    return loss_fn
