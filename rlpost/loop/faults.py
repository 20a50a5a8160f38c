"""Stopping a run cleanly on SIGINT or SIGTERM.

The first signal asks the controller to stop at the next step boundary: it
checkpoints the step it just finished and raises ``Interrupted``, which
unwinds through the run's cleanup (workers closed, Ray stopped); the CLI then
exits with 128 + the signal number (130, 143) and says how to resume. A
second signal, or one that arrives before the first step starts, raises
``Interrupted`` at once (cleanup still runs; nothing new is checkpointed).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A run stopped by ``signum``; ``checkpoint`` holds step ``step`` when one was
    written. ``at_start`` says the signal came before the step loop began."""

    def __init__(
        self,
        signum: int,
        step: int | None = None,
        checkpoint: Path | None = None,
        at_start: bool = False,
    ):
        super().__init__(signal.Signals(signum).name)
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        self.at_start = at_start

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def advice(self) -> str:
        name = signal.Signals(self.signum).name
        if self.checkpoint is not None and self.step is not None:
            run_dir = self.checkpoint.parent.parent  # run_dir/checkpoints/step_N
            return (
                f"stopped by {name} after step {self.step} (checkpoint {self.checkpoint}); "
                f"resume with the same command and trainer.run_dir={run_dir} "
                f"(trainer.resume=auto) to continue from step {self.step + 1}"
            )
        latest = (
            "trainer.resume=auto continues from the latest checkpoint in trainer.run_dir, "
            "if there is one"
        )
        if self.at_start:
            return (
                f"stopped by {name} during start-up, before the first step: nothing was "
                f"trained, so this run wrote no checkpoint to resume from; rerun the same "
                f"command to start again ({latest})"
            )
        return (
            f"stopped at once by a second {name}: the step in progress was not checkpointed; "
            f"rerun the same command to go on ({latest})"
        )


class StopOnSignal:
    """SIGINT and SIGTERM handlers for one run (main thread only).

    ``install()`` replaces the handlers and ``restore()`` puts the previous
    ones back. Once ``armed`` (the step loop is running) the first signal only
    sets ``signum``, which the controller polls between steps (``requested()``);
    otherwise, and for a second signal, the handler raises ``Interrupted``.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.armed = False
        # The signal the handler raised ``Interrupted`` for, and whether before the
        # step loop (a blocking ray.get re-raises it as a plain KeyboardInterrupt).
        self.raised: int | None = None
        self.raised_at_start = False
        # signal -> its handler before ``install`` (``signal.signal``'s answer)
        self._previous: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # e.g. a notebook running train() in a thread: signals stay as they are
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def requested(self) -> int | None:
        """The signal that asked the run to stop, if one did."""
        return self.signum

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.armed and self.signum is None:
            self.signum = signum
            log.warning(
                "%s: stopping after the current step with a checkpoint (send it again to stop "
                "at once)",
                signal.Signals(signum).name,
            )
            return
        self.raised, self.raised_at_start = signum, not self.armed
        raise Interrupted(signum, at_start=not self.armed)
