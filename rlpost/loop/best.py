"""``trainer.save_best``: the policy at its best held-out figure so far, kept in
``run_dir/best`` (a Hugging Face directory, as ``final/``) with ``best.json`` naming
the step, the figure and its value. The figure is the run's headline
(``rlpost.loop.tracking.headline``): accuracy and pair accuracy higher, NLL lower."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from rlpost.loop.tracking import headline

log = logging.getLogger(__name__)

RECORD = "best.json"
LOWER_IS_BETTER = frozenset({"val/nll"})


class BestPolicy:
    """Offered each validation's metrics, saves the policy (``save(directory)``)
    when its held-out headline beats every earlier one, the resumed run's included
    (``run_dir/best/best.json``)."""

    def __init__(self, run_dir: Path, save: Callable[[str], object]):
        self.dir, self.save = run_dir / "best", save
        self.record: dict | None = None
        if (self.dir / RECORD).exists():
            self.record = json.loads((self.dir / RECORD).read_text())

    def offer(self, step: int, metrics: dict[str, float], history: list[dict]) -> bool:
        """Save the policy as the best if ``metrics`` (step ``step``'s, not yet in
        ``history``) hold a better headline value than the best so far."""
        key = headline([*history, metrics]).val
        value = metrics.get(key)
        if not isinstance(value, (int, float)) or value != value:  # absent or NaN
            return False
        if self.record is not None and self.record["key"] == key:
            best = self.record["value"]
            better = value < best if key in LOWER_IS_BETTER else value > best
            if not better:
                return False
        self.save(str(self.dir))
        self.record = {"step": step, "key": key, "value": float(value)}
        (self.dir / RECORD).write_text(json.dumps(self.record) + "\n")
        log.info("best held-out %s so far, %.4f at step %d: %s", key, value, step, self.dir)
        return True
