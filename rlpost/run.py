"""``train(cfg)``: plan the run, start its workers, run the controller."""

from __future__ import annotations

from rlpost.config.groups import Config
from rlpost.loop.faults import StopOnSignal
from rlpost.plan.plan import build_plan
from rlpost.result import RunResult


def train(cfg: Config, stop: StopOnSignal | None = None) -> RunResult:
    """Run ``cfg`` to the end; returns the metric history and the final model's path.

    Everything that can fail on user input fails in ``build_plan``, before Ray
    starts, as one config error naming every problem. ``stop`` (the CLI's):
    SIGINT and SIGTERM stop the run at the next step boundary with a checkpoint,
    raising ``Interrupted`` after the cleanup.
    """
    plan = build_plan(cfg)
    from rlpost.launch import Launch

    with Launch(plan, stop) as launch:
        controller = launch.controller()
        if stop is not None:
            stop.armed = True  # from here a signal waits for the end of the step
        result = controller.run()
        controller.tracker.plot()
        return result
