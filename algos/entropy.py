"""Token entropy of the policy's next-token distribution.

Shapes: b = samples, t = tokens, v = vocab.
"""

from __future__ import annotations

import torch


def entropy_from_logits(logits_btv: torch.Tensor) -> torch.Tensor:
    """H = logsumexp(z) - sum_v softmax(z)_v z_v, per token; [b, t, v] -> [b, t].

    Written with logsumexp so large logits neither overflow nor lose precision.
    """
    logz_bt = torch.logsumexp(logits_btv, dim=-1)
    p_btv = torch.softmax(logits_btv, dim=-1)
    return logz_bt - (p_btv * logits_btv).sum(-1)
