"""A data row's own ``max_tokens`` / ``min_tokens``: within rollout.*'s limits,
checked like any other column."""

from __future__ import annotations

from rlpost.data.rows import validate_row
from rlpost.loop.collect import row_sampling
from rlpost.rollout.base import SamplingConfig

BASE = SamplingConfig(n=4, max_tokens=64, min_tokens=2, seed=3)


def test_a_row_shortens_its_limit_and_sets_its_floor_but_never_exceeds_the_rollouts():
    assert row_sampling(BASE, {"prompt": "x"}) is BASE
    short = row_sampling(BASE, {"prompt": "x", "max_tokens": 10})
    assert (short.max_tokens, short.min_tokens, short.n, short.seed) == (10, 2, 4, 3)
    forced = row_sampling(BASE, {"prompt": "x", "max_tokens": 30, "min_tokens": 30})
    assert (forced.max_tokens, forced.min_tokens) == (30, 30)
    capped = row_sampling(BASE, {"prompt": "x", "max_tokens": 500, "min_tokens": 400})
    assert (capped.max_tokens, capped.min_tokens) == (64, 64)  # rollout.max_tokens wins
    assert row_sampling(BASE, {"prompt": "x", "max_tokens": 0}).max_tokens == 1


def test_bad_length_columns_name_the_column():
    assert validate_row({"prompt": "x", "max_tokens": 12}) is None
    assert "'max_tokens' is 1.5" in validate_row({"prompt": "x", "max_tokens": 1.5})
    assert "'min_tokens' is -1" in validate_row({"prompt": "x", "min_tokens": -1})
    assert "'max_tokens' is True" in validate_row({"prompt": "x", "max_tokens": True})
