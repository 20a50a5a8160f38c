"""The rows dropped at load (``data/*``) are logged on every step, whatever the
algorithm's step reports: the load warnings point the user at these keys."""

from __future__ import annotations

from types import SimpleNamespace

from rlpost.config.compose import compose
from rlpost.loop.controller import Controller


def _controller(overrides: list[str], logged: list[tuple[int, dict]]) -> Controller:
    c = object.__new__(Controller)  # log_steps reads only what is set here
    c.cfg = compose([*overrides, "trainer.total_steps=2", "trainer.save_every=0"])
    c.malformed_rows, c.dropped_chars, c.long_prompts = 3, 5, 7
    c.validate = lambda step: {}
    c.best = None  # trainer.save_best is off
    c.source = None  # no RL steps
    c.version = 0
    c.stream = SimpleNamespace(curriculum=None)  # data.curriculum=none
    c.timeline = SimpleNamespace(collect=lambda: {})  # trainer.trace: nothing to gather
    c.tracker = SimpleNamespace(log=lambda step, m: logged.append((step, dict(m))))
    c.recovery = SimpleNamespace(
        trainer_restarts=0,
        count_bad_step=lambda step, m: None,
        check_logprob_gap=lambda step, m: None,
        stop_if_requested=lambda step, saved: None,
    )
    return c


def test_preference_steps_log_the_malformed_pairs():
    logged: list[tuple[int, dict]] = []
    c = _controller(["algo=dpo", "data=arith_pref"], logged)
    # a preference step reports its loss and pairs, nothing of the rows dropped at load
    steps = iter([{"dpo/loss": 0.69, "data/pairs": 40.0}, {"dpo/loss": 0.6, "data/pairs": 40.0}])
    c.log_steps(range(1, 3), steps)
    assert [step for step, _ in logged] == [1, 2]
    for _, m in logged:
        assert m["data/malformed_rows"] == 3.0
        assert m["data/dropped_chars"] == 5.0 and m["data/dropped_long_prompts"] == 7.0
        assert m["dpo/loss"] > 0
