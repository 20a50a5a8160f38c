"""``algo=sft``: supervised fine-tuning on the rows' targets, a recipe of its own
beside the RL loop. The controller runs its steps with the same validation,
logging, checkpoints and stops as every other recipe."""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import TYPE_CHECKING

from rlpost.data.rows import PromptStream
from rlpost.data.samples import sft_batch
from rlpost.loop.roles import Workers
from rlpost.serving.weight_sync import WeightSync

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class SftSteps:
    """Each step: a batch of rows, one update on their targets (``messages``'
    assistant turns, ``response``, else ``answer``), the weights to the replicas
    (the held-out figures sample from them)."""

    def __init__(
        self,
        workers: Workers,
        tokenizer: PreTrainedTokenizerBase,
        stream: PromptStream,
        weights: WeightSync,
    ):
        self.workers, self.tokenizer, self.stream, self.weights = (
            workers,
            tokenizer,
            stream,
            weights,
        )

    def steps(self, first: int, last: int) -> Generator[dict[str, float], None, None]:
        for step in range(first, last + 1):
            start = time.perf_counter()
            batch = sft_batch(self.tokenizer, self.stream.next_batch())
            metrics = self.workers.policy.update_sft(batch)
            metrics.update(self.weights.push(step))
            metrics["timing/step_s"] = time.perf_counter() - start
            metrics["perf/tokens_per_s"] = (
                float(batch.attention_mask_bt.sum()) / metrics["timing/step_s"]
            )
            yield metrics
