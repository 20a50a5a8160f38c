"""The difficulty curriculum (``data.curriculum``): prompts the policy always
solves, or never does, stop costing generation.

Each prompt's memory is whether its last ``window`` groups were *settled*: every
sample of the group scored the same (all right, or all wrong), so that GRPO's
group-normalised advantage is zero for all of them and the update learns
nothing from the group. A prompt whose last ``window`` groups were all settled
is skipped when the stream comes to it, except that each time it comes up it
returns with probability ``return_rate`` (a policy that improved, or forgot,
shows it then). That is the pool (prime-rl's difficulty pool). The gate adds
the filter after generation: a group whose rewards all agree is not trained,
and another takes its place (DAPO's dynamic sampling, which the pool's memory
mostly spares the generation of).

The decisions are seeded by ``(seed, epoch, position)`` and the memory is in
the prompt stream's ``state_dict``, so a resumed run admits exactly the prompts
an uninterrupted one would.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

MODES = ("none", "pool", "gate")


class Curriculum:
    def __init__(self, mode: str, window: int, return_rate: float, seed: int):
        if mode not in MODES:
            raise ValueError(f"data.curriculum={mode!r}: use one of {', '.join(MODES)}")
        self.mode, self.window, self.return_rate, self.seed = mode, window, return_rate, seed
        self.memory: dict[int, list[bool]] = {}  # row -> its last groups, settled or not
        self.skipped = 0  # times a settled prompt was passed over
        self.returned = 0  # times a settled prompt came back anyway

    @property
    def on(self) -> bool:
        return self.mode != "none"

    def record(self, row: int, scores: Sequence[float]) -> None:
        """One group of prompt ``row`` was scored: ``scores`` of its samples."""
        settled = max(scores) == min(scores)
        seen = self.memory.setdefault(row, [])
        seen.append(settled)
        del seen[: -self.window]

    def settled(self, row: int) -> bool:
        seen = self.memory.get(row, [])
        return len(seen) == self.window and all(seen)

    def admit(self, row: int, epoch: int, position: int) -> bool:
        """Whether prompt ``row``, at ``position`` of ``epoch``'s order, is generated."""
        if not self.on or not self.settled(row):
            return True
        if random.Random(f"{self.seed}/{epoch}/{position}/return").random() < self.return_rate:
            self.returned += 1
            return True
        self.skipped += 1
        return False

    def metrics(self) -> dict[str, float]:
        return {
            "data/curriculum_settled_rows": float(sum(map(self.settled, self.memory))),
            "data/curriculum_skipped": float(self.skipped),
            "data/curriculum_returned": float(self.returned),
        }

    def state_dict(self) -> dict:
        return {
            "memory": {str(k): v for k, v in self.memory.items()},
            "skipped": self.skipped,
            "returned": self.returned,
        }

    def load_state_dict(self, d: dict) -> None:
        self.memory = {int(k): list(v) for k, v in d["memory"].items()}
        self.skipped, self.returned = d["skipped"], d["returned"]
