"""What the RL loop does when something goes wrong: checkpoints and resume, a
trainer rank's death, a stop signal, NaN updates and a rollout that samples from
other weights than the trainer's.

The controller holds one ``Recovery``; it shares the controller's worker
groups, prompt stream and KL controller, and calls back ``sync_weights`` after
it has loaded new weights into the trainers.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from ray.exceptions import RayActorError

from rlpost.algos import AdaptiveKLController, FixedKLController
from rlpost.config.groups import Config
from rlpost.data.rows import PromptStream
from rlpost.loop.checkpoint import (
    CheckpointManager,
    load_driver_state,
    pick_checkpoint,
    save_driver_state,
)
from rlpost.loop.faults import Interrupted
from rlpost.loop.roles import TrainerGroups, Workers
from rlpost.loop.tracking import Tracker
from rlpost.result import RunError

if TYPE_CHECKING:
    from rlpost.loop.source import InFlight

log = logging.getLogger(__name__)
# What ``rewind`` restores: the prompt stream's state, the KL coefficient, and the
# python and torch RNG states.
DriverSnapshot = tuple[dict, float, tuple[object, ...], torch.Tensor]


class Recovery:
    def __init__(
        self,
        cfg: Config,
        run_dir: Path,
        workers: Workers,
        stream: PromptStream,
        kl_ctl: FixedKLController | AdaptiveKLController,
        tracker: Tracker,
        sync_weights: Callable[..., dict[str, float]],
        rebuild_trainers: Callable[[], TrainerGroups] | None = None,
        stop_requested: Callable[[], int | None] | None = None,
    ):
        """``rebuild_trainers`` closes the trainer groups and starts new ones (policy,
        reference, critic, teacher) after a rank died; ``stop_requested`` returns the signal
        that asked the run to stop, polled between steps."""
        self.cfg, self.run_dir, self.workers = cfg, run_dir, workers
        self.stream, self.kl_ctl, self.tracker = stream, kl_ctl, tracker
        self.sync_weights = sync_weights
        self.rebuild_trainers, self.stop_requested = rebuild_trainers, stop_requested
        self.ckpt = CheckpointManager(run_dir, cfg.trainer.keep_last)
        self.resumed_from: Path | None = None
        self.trainer_restarts = 0
        self.bad_steps = 0  # updates skipped in a row (NaN/Inf)
        self.start_state: DriverSnapshot | None = None
        # The rollout source's generation in flight, as a checkpoint keeps it
        # (``RolloutSource.state_dict``), and the one a restore brought back.
        self.in_flight: Callable[[], InFlight | None] | None = None
        self.restored_in_flight: InFlight | None = None

    def check_logprob_gap(self, step: int, metrics: dict[str, float]) -> None:
        """The rollout must sample from the weights being trained. A gap between its
        log-probs and the trainer's above ``rollout.max_mean_logprob_gap`` on average,
        or, when both sides compute in float32, above ``rollout.max_logprob_gap`` at
        any token, stops the run (16-bit rounding moves single tokens by 0.1-0.3)."""
        r, cfg = self.cfg.rollout, self.cfg
        float32 = cfg.model.dtype == r.dtype == "float32" and cfg.trainer.mixed_precision == "none"
        checks = [("mean", "max_mean_logprob_gap", r.max_mean_logprob_gap)]
        if float32:
            checks.append(("max", "max_logprob_gap", r.max_logprob_gap))
        for stat, key, limit in checks:
            gap = metrics.get(f"rollout/logprob_abs_diff_{stat}")
            if limit is None or gap is None or gap <= limit:
                continue
            when = "before the first weight sync" if step == 1 else "after the weight sync"
            what = "on average" if stat == "mean" else "at a token"
            raise RunError(
                f"step {step}: the rollout's log-probs differ from the trainer's by {gap:.3g} "
                f"{what} {when} (rollout.{key}={limit:g}): the rollout engine is not sampling "
                f"from the policy being trained. With model.path={cfg.model.path}, check that "
                "the engine supports this architecture (SUPPORT.md), and that rollout.dtype "
                f"({r.dtype}) computes as the trainer does; or raise rollout.{key}, or set it "
                "to null to turn the check off."
            )

    def count_bad_step(self, step: int, metrics: dict[str, float]) -> None:
        """Updates skipped for a NaN or Inf loss or gradient; ``trainer.max_bad_steps``
        of them in a row stop the run (the weights are still those of the last good step)."""
        skipped = sum(v for k, v in metrics.items() if k.endswith("/skipped_updates"))
        self.bad_steps = self.bad_steps + 1 if skipped else 0
        limit = self.cfg.trainer.max_bad_steps
        if self.bad_steps >= limit:
            raise RunError(
                f"step {step}: the update was skipped {limit} steps in a row "
                f"(trainer.max_bad_steps={limit}) because the loss or the gradients were NaN "
                "or Inf. Check the rewards and advantages for NaN and lower trainer.lr; the last "
                "checkpoint holds good weights."
            )

    # -- checkpoints ----------------------------------------------------------------
    def save_checkpoint(self, step: int) -> None:
        """Engines, data position, KL coefficient and RNG, atomically (run_dir/checkpoints).

        In one_step_off mode the next step's batch is already being generated with
        the weights from before this step's update, which the checkpoint does not
        hold: it keeps the rollout source's state (``in_flight``): that batch, and
        the stream position from before its rows were drawn, so a resumed run
        trains on the same batch as an uninterrupted one.
        """
        w = self.workers
        in_flight = self.in_flight() if self.in_flight is not None else None

        def write(tmp: Path) -> None:
            w.policy.save_checkpoint(str(tmp / "policy"))
            if w.critic is not None:
                w.critic.save_checkpoint(str(tmp / "critic"))
            stream = in_flight.pop("stream") if in_flight else self.stream.state_dict()
            state: dict[str, object] = {
                "step": step,
                "stream": stream,
                "kl_coef": self.kl_ctl.value,
            }
            if in_flight:
                state["in_flight"] = in_flight
            save_driver_state(tmp, state)

        start = time.perf_counter()
        # A rank that dies while saving is a rank death (restart_trainers), not a disk fault.
        self.ckpt.atomic_write(step, write, passthrough=(RayActorError,))
        self.ckpt.prune()
        log.info("checkpoint of step %d written in %.1f s", step, time.perf_counter() - start)

    def restore(self, path: Path | None = None) -> int:
        """Load ``path``, else ``trainer.resume``'s checkpoint, if any; returns its step
        (0 if none)."""
        t = self.cfg.trainer
        path = path or pick_checkpoint(t.resume, self.run_dir, t.keep_last)
        if path is None:
            self.tracker.truncate(-1)  # a fresh run in a used directory starts a new log
            return 0
        self.resumed_from = path
        w = self.workers
        w.policy.load_checkpoint(str(path / "policy"))
        if w.critic is not None:
            w.critic.load_checkpoint(str(path / "critic"))
        state = load_driver_state(path)
        self.stream.load_state_dict(state["stream"])
        self.restored_in_flight = state.get("in_flight")
        self.kl_ctl.value = state["kl_coef"]
        self.sync_weights(version=int(state["step"]))
        self.tracker.truncate(state["step"])
        log.info("resumed from %s (step %d)", path, state["step"])
        return int(state["step"])

    # -- faults -------------------------------------------------------------------
    def restart_trainers(self, exc: RayActorError) -> int:
        """A trainer rank died: rebuild every trainer group, load the latest checkpoint
        (or go back to step 0 if there is none) and re-sync the rollout; returns the
        step the run continues after. Re-raises ``exc`` when the dead actor is not a
        trainer rank; a ``RunError`` naming ``trainer.max_restarts`` when the restarts
        are used up."""
        w = self.workers
        groups = [g for g in (w.policy, w.reference, w.critic, w.teacher) if g is not None]
        limit = self.cfg.trainer.max_restarts
        if self.rebuild_trainers is None or not any(g.owns(exc.actor_id) for g in groups):
            raise exc
        why = " ".join(str(exc).split())[:300]
        if self.trainer_restarts >= limit:
            last = self.ckpt.latest()
            raise RunError(
                f"a trainer rank died after trainer.max_restarts={limit} restart(s) were used "
                f"up ({why}). The last checkpoint is {last or 'none (the run starts afresh)'}: "
                "rerun the same command (trainer.resume=auto) to continue from it, and raise "
                "trainer.max_restarts if ranks are expected to die (preemptible nodes)."
            ) from exc
        self.trainer_restarts += 1
        start = time.perf_counter()
        log.warning("a trainer rank died; restart %d of %d: %s", self.trainer_restarts, limit, why)
        w.policy, w.reference, w.critic, w.teacher = self.rebuild_trainers()
        path = pick_checkpoint("auto", self.run_dir, self.cfg.trainer.keep_last)
        path = path or self.resumed_from
        step = self.restore(path) if path is not None else self.rewind()
        seconds = time.perf_counter() - start
        log.warning("trainer groups rebuilt in %.1f s; redoing the steps after %d", seconds, step)
        return step

    def driver_snapshot(self) -> DriverSnapshot:
        """What ``rewind`` restores: data position, KL coefficient, RNG states."""
        rng = (random.getstate(), torch.get_rng_state())
        return (self.stream.state_dict(), self.kl_ctl.value, *rng)

    def rewind(self) -> int:
        """No checkpoint yet: back to where the run started (data position, KL
        coefficient, RNG; rebuilt trainers hold the initial model). Returns 0."""
        assert self.start_state is not None, "rewind before the run's start was kept"
        stream, kl_coef, python_rng, torch_rng = self.start_state
        self.stream.load_state_dict(stream)
        self.restored_in_flight = None
        self.kl_ctl.value = kl_coef
        random.setstate(python_rng)
        torch.set_rng_state(torch_rng)
        self.sync_weights(version=0)
        self.tracker.truncate(0)
        return 0

    def stop_if_requested(self, step: int, saved: bool) -> None:
        """A SIGINT or SIGTERM arrived: checkpoint ``step`` (unless just done) and unwind."""
        signum = self.stop_requested() if self.stop_requested is not None else None
        if signum is None:
            return
        if not saved:
            self.save_checkpoint(step)
        raise Interrupted(signum, step, self.ckpt.step_dir(step))
