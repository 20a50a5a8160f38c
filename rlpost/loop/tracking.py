"""Metric sinks (console, JSONL, wandb offline), the progress bar and the plot."""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

if TYPE_CHECKING:
    from wandb import Run

log = logging.getLogger(__name__)


class Tracker:
    def __init__(
        self, run_dir: Path, loggers: list[str], total_steps: int, config: dict[str, object]
    ):
        self.run_dir = run_dir
        self.loggers = loggers
        self.history: list[dict[str, float]] = []
        self.bar = tqdm(total=total_steps, desc="rlpost", unit="step", dynamic_ncols=True)
        self._jsonl = open(run_dir / "metrics.jsonl", "a") if "jsonl" in loggers else None
        self._wandb: Run | None = None
        if "wandb" in loggers:
            os.environ.setdefault("WANDB_MODE", "offline")
            os.environ.setdefault("WANDB_SILENT", "true")
            import wandb

            self._wandb = wandb.init(
                project="rlpost", dir=str(run_dir), config=config, name=run_dir.name
            )

    @property
    def wandb_run(self) -> Run | None:
        """The wandb run when ``wandb`` is among the loggers, else None."""
        return self._wandb

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row = {"step": step, **{k: _plain(v) for k, v in sorted(metrics.items())}}
        self.history.append(row)
        if self._jsonl:
            self._jsonl.write(json.dumps(row) + "\n")
            self._jsonl.flush()
        if self._wandb is not None:
            self._wandb.log(row, step=step)
        if step > self.bar.n:
            self.bar.update(step - self.bar.n)
        postfix = {}
        if "reward/mean" in row:
            postfix["reward"] = f"{row['reward/mean']:.3f}"
        key, short = val_headline(self.history)
        last_val = next((h[key] for h in reversed(self.history) if key in h), None)
        if last_val is not None:
            postfix[short] = f"{last_val:.3f}"
        if "perf/tokens_per_s" in row:
            postfix["tok/s"] = f"{row['perf/tokens_per_s']:.0f}"
        self.bar.set_postfix(postfix)
        if "console" in self.loggers and key in row:
            self.bar.write(
                f"step {step}: {key}={row[key]:.3f}"
                + (f" reward/mean={row['reward/mean']:.3f}" if "reward/mean" in row else "")
            )

    def truncate(self, step: int) -> None:
        """Forget rows after ``step`` (a resumed run redoes them), in memory and on disk."""
        path = self.run_dir / "metrics.jsonl"
        if path.exists():
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            self.history = [r for r in rows if r["step"] <= step]
        else:
            self.history = [r for r in self.history if r["step"] <= step]
        if self._jsonl:
            self._jsonl.close()
            path.write_text("".join(json.dumps(r) + "\n" for r in self.history))
            self._jsonl = open(path, "a")
        # A fresh run truncates to step -1 (nothing kept); the bar starts at 0.
        self.bar.n = max(step, 0)
        self.bar.refresh()

    def plot(self) -> Path | None:
        # A figure of its own (no pyplot): the notebook's plotting backend stays as it is.
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(7, 4))
        FigureCanvasAgg(fig)
        ax = fig.subplots()
        h = headline(self.history)
        values = []
        for key, style in ((h.train, "-"), (h.val, "o-")):
            pts = [
                (r["step"], r[key]) for r in self.history if isinstance(r.get(key), (int, float))
            ]
            if pts:
                ax.plot(*zip(*pts), style, label=key)
                values += [v for _, v in pts]
        ax.set_xlabel("step")
        if values and 0 <= min(values) and max(values) <= 1:  # accuracies, rewards in [0, 1]
            ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend()
        ax.set_title(self.run_dir.name)
        path = self.run_dir / "curves.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        return path

    def close(self) -> None:
        self.bar.close()
        if self._jsonl:
            self._jsonl.close()
        if self._wandb is not None:
            run_dir = getattr(self._wandb, "dir", None)  # .../wandb/<run>/files
            offline = os.environ.get("WANDB_MODE") == "offline"
            self._wandb.finish()
            if offline and run_dir:
                where = Path(run_dir).parent
                log.info("wandb offline run: %s; upload it with `wandb sync %s`", where, where)


def _plain(value: object) -> Any:
    """A metric as JSON holds it: a float (a tensor's or numpy's scalar too), or the
    text of one that is not finite. The answer is left untyped: ``history`` declares
    its values floats (``RunResult.history``) and holds those texts among them."""
    value = float(value) if hasattr(value, "__float__") else value
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


@dataclass(frozen=True)
class Headline:
    """The figure a run is judged by: held out (``val``) and its training twin
    (``train``), and a short name for the progress bar."""

    val: str
    train: str
    short: str


# One per kind of run, in the order they are looked for: the final line, curves.png,
# the progress bar and the board all take theirs from here.
HEADLINES = (
    Headline("val/accuracy", "reward/mean", "val_acc"),  # RL, a correctness signal
    Headline("val/pair_accuracy", "rm/accuracy", "val_pair_acc"),  # algo=rm
    Headline("val/rewards/accuracies", "rewards/accuracies", "val_pair_acc"),  # algo=dpo ...
    Headline("val/nll", "sft/nll", "val_nll"),  # algo=sft
    Headline("val/loss_per_token", "loss/per_token", "loss"),  # a tenant of rlpost serve
    Headline("val/reward_mean", "reward/mean", "val_reward"),  # RL
)


def headline(history: Iterable[Mapping[str, object]]) -> Headline:
    """The run's ``Headline``: the first whose held-out figure was logged, else (a run
    without validation) the first whose training figure was; RL's is then
    ``reward/mean`` under ``val/reward_mean``."""
    keys = {k for row in history for k in row}
    for h in HEADLINES:
        if h.val in keys:
            return h
    return next((h for h in HEADLINES[1:] if h.train in keys), HEADLINES[-1])


def val_headline(history: Iterable[Mapping[str, object]]) -> tuple[str, str]:
    """The held-out figure a run is judged by and its short name (``headline``)."""
    h = headline(history)
    return h.val, h.short


def first_and_last(history: Sequence[Mapping[str, object]]) -> tuple[str, float, float] | None:
    """The headline's held-out figure (or, without validation, its training one):
    its first and last logged value; None where neither was logged."""
    h = headline(history)
    for key in (h.val, h.train):
        values = [float(v) for r in history if isinstance(v := r.get(key), (int, float))]
        if values:
            return key, values[0], values[-1]
    return None
