"""Methods added to every vLLM worker (``worker_extension_cls``).

Names are prefixed ``rlpost_`` so they never clash with the worker's own.
"""

from __future__ import annotations

import torch


class WeightSyncExtension:
    def rlpost_load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> int:
        """Reload weights in place through the model runner (works for CPU-processed layers)."""
        self.model_runner.reload_weights(weights_iterator=iter(named_tensors))  # type: ignore[attr-defined]
        return len(named_tensors)
