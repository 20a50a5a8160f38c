"""Each tenant's training as a run folder the board lists (``rlpost board --runs
STATE_DIR/runs``): ``config.yaml`` says what the tenant is, ``metrics.jsonl`` holds
one row per ``optim_step`` with what the ``forward_backward`` calls before it
returned (``loss:sum``, as the SDK reports it) and what the step did.

The folder is the one the tenant's checkpoints go in
(``STATE_DIR/runs/<model id>/weights/<name>``)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml


@dataclass
class TenantLog:
    folder: Path
    # what the forward_backward calls since the last optim_step added up to
    loss_sum: float = 0.0
    tokens: float = 0.0  # target positions with a nonzero weight
    datums: int = 0
    calls: int = 0
    last: float = field(default_factory=time.monotonic)

    @classmethod
    def start(cls, folder: Path, description: Mapping[str, object]) -> TenantLog:
        """A tenant's log in ``folder``, with its ``config.yaml`` (``description``: the
        base model, the LoRA settings and the model id)."""
        folder.mkdir(parents=True, exist_ok=True)
        lora = description.get("lora") or {}
        rank = lora.get("rank") if isinstance(lora, dict) else None
        config = {
            # the board's columns: what trains it, on which model, from what
            "algo": {"name": "tinker"},
            "model": {"path": description.get("base_model")},
            "data": {"name": f"SDK client, LoRA rank {rank}"},
            "tenant": dict(description),
        }
        (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        return cls(folder)

    def forward_backward(self, loss_sum: float, tokens: float, datums: int) -> None:
        self.loss_sum += loss_sum
        self.tokens += tokens
        self.datums += datums
        self.calls += 1

    def optim_step(self, step: int, grad_norm: float, learning_rate: float) -> None:
        """Append the step's row; the sums start again."""
        now = time.monotonic()
        row: dict[str, float] = {
            "step": step,
            "loss:sum": self.loss_sum,
            "loss/per_token": self.loss_sum / max(self.tokens, 1.0),
            "train/datums": float(self.datums),
            "train/tokens": self.tokens,
            "train/forward_backward_calls": float(self.calls),
            "optim/grad_norm": grad_norm,
            "optim/learning_rate": learning_rate,
            "timing/step_s": now - self.last,
        }
        with open(self.folder / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        self.loss_sum = self.tokens = 0.0
        self.datums = self.calls = 0
        self.last = now
