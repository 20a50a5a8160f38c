"""Sequence parallelism (``trainer.megatron.sequence_parallel``) with torch's own norm.

With sequence parallelism the activations between the tensor-parallel blocks
(the norms, the residual stream, the embedding's output) are split along the
sequence over the tp ranks; each block's first linear layer all-gathers them
and its last one reduce-scatters its output (megatron-core's
``ColumnParallelLinear`` / ``RowParallelLinear``; gloo runs both collectives).

megatron-core's local layer spec normalises with ``WrappedTorchNorm``, which
refuses sequence parallelism: a norm then sees only its rank's tokens, so its
weight's gradient is partial and has to be summed over the tp ranks, which
megatron does for parameters marked ``sequence_parallel``. ``RMSNorm`` below is
torch's RMSNorm with that mark; the engine puts it in every norm slot of the
spec when sequence parallelism is on (the output is identical).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F


class NormConfig(Protocol):
    """What ``RMSNorm`` reads of megatron-core's ``TransformerConfig``."""

    params_dtype: torch.dtype
    sequence_parallel: bool


class RMSNorm(torch.nn.Module):
    """``torch.nn.RMSNorm`` built from megatron's norm arguments, its weight marked
    for the tensor-parallel gradient sum when sequence parallelism is on."""

    def __init__(self, config: NormConfig, hidden_size: int, eps: float = 1e-5, **_: object):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        self.weight.sequence_parallel = config.sequence_parallel  # type: ignore[attr-defined]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


# megatron-core's ``ModuleSpec``, ``TransformerConfig`` and block submodules: no type information
def block_spec(layer_spec: Any, config: Any, vp_stage: int | None = None) -> Any:
    """This (virtual) stage's transformer block submodules: ``layer_spec`` (a layer's
    ``ModuleSpec``, changed in place) with ``RMSNorm`` in every norm slot it
    fills, and ``RMSNorm`` as the block's final norm."""
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )

    sub = layer_spec.submodules
    attn = sub.self_attention.submodules
    for owner, slot in [
        (sub, "input_layernorm"),
        (sub, "pre_mlp_layernorm"),
        (attn, "q_layernorm"),
        (attn, "k_layernorm"),
    ]:
        if getattr(owner, slot) is not IdentityOp:
            setattr(owner, slot, RMSNorm)
    layers = get_num_layers_to_build(config, vp_stage=vp_stage)
    return TransformerBlockSubmodules(layer_specs=[layer_spec] * layers, layer_norm=RMSNorm)
