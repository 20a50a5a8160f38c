"""What the loop says when a step trains nothing."""

from __future__ import annotations

import logging

from rlpost.loop.collect import Rollouts
from rlpost.loop.controller import Controller


def test_a_dapo_step_whose_groups_all_agreed_says_why_it_did_not_update(caplog):
    controller = object.__new__(Controller)  # rl_step reads nothing else for an empty batch
    controller.source = None
    metrics = {"dapo/gen_rounds": 3.0, "dapo/dropped_groups": 48.0, "timing/generate_s": 1.0}
    with caplog.at_level(logging.WARNING, logger="rlpost.loop.controller"):
        out = controller.rl_step(7, Rollouts([], [], {}), dict(metrics))
    assert out == metrics  # nothing trained, nothing added
    assert "step 7: no update: the rewards of every group agreed in all 3 generation round(s)" in (
        caplog.text
    )
    assert "(dapo/dropped_groups=48); raise algo.dynamic_sampling.max_rounds" in caplog.text
