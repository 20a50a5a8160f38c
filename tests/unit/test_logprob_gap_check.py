"""Which log-prob gap stops a sync-mode run: the largest one only when both sides
compute in float32, the mean one always (hand-picked gaps around each limit)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlpost.config.compose import compose
from rlpost.config.schema import ConfigError
from rlpost.loop.recovery import Recovery
from rlpost.result import RunError


def check(overrides: list[str], max_gap: float, mean_gap: float) -> None:
    run = SimpleNamespace(cfg=compose(["algo=grpo", *overrides]))
    metrics = {"rollout/logprob_abs_diff_max": max_gap, "rollout/logprob_abs_diff_mean": mean_gap}
    Recovery.check_logprob_gap(run, 3, metrics)  # type: ignore[arg-type]


def test_float32_stops_on_one_token_above_the_limit():
    check([], 0.009, 0.001)
    with pytest.raises(RunError, match=r"by 0.02 at a token .*rollout.max_logprob_gap=0.01"):
        check([], 0.02, 0.001)


@pytest.mark.parametrize(
    "overrides",
    [["trainer.mixed_precision=bf16"], ["model.dtype=bfloat16"], ["rollout.dtype=bfloat16"]],
)
def test_16_bit_on_either_side_checks_the_mean(overrides):
    check(overrides, 0.3, 0.01)  # bf16 rounding: a large single gap, a small mean
    with pytest.raises(RunError, match=r"by 0.2 on average .*rollout.max_mean_logprob_gap=0.05"):
        check(overrides, 0.3, 0.2)


def test_null_turns_a_check_off():
    check(["rollout.max_logprob_gap=null", "rollout.max_mean_logprob_gap=null"], 5.0, 5.0)


def test_rollout_dtype_follows_the_trainers_compute():
    assert compose(["algo=grpo"]).rollout.dtype == "float32"
    assert compose(["algo=grpo", "trainer.mixed_precision=bf16"]).rollout.dtype == "bfloat16"
    assert compose(["algo=grpo", "model.dtype=float16"]).rollout.dtype == "float16"
    bf16_fp32 = ["trainer.mixed_precision=bf16", "rollout.dtype=float32"]
    assert compose(["algo=grpo", *bf16_fp32]).rollout.dtype == "float32"


def test_mixed_precision_over_a_16_bit_model_is_a_config_error():
    with pytest.raises(
        ConfigError, match=r"trainer.mixed_precision=bf16 with model.dtype=bfloat16"
    ):
        compose(["algo=grpo", "model.dtype=bfloat16", "trainer.mixed_precision=bf16"])
