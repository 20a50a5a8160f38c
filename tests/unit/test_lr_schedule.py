"""``trainer.lr_schedule``: the warm-up, then constant, linear or cosine decay to a floor,
by hand; the FSDP2 backend's scheduler and the plan follow it."""

from __future__ import annotations

import math

import pytest
import torch

from rlpost.trainers.lr_schedule import lr_factor


def test_constant_is_the_linear_warm_up_then_one():
    # warm-up 3: (step + 1) / 4 = 0.25, 0.5, 0.75, then 1 for good
    assert [lr_factor(s, 3) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert [lr_factor(s, 0) for s in range(3)] == [1.0, 1.0, 1.0]


def test_linear_and_cosine_decay_after_the_warm_up_to_the_floor():
    # warm-up 2, decay over steps 2..10 (8 steps), floor 0.1: p = (step - 2) / 8
    lin = [lr_factor(s, 2, "linear", 10, 0.1) for s in range(12)]
    assert lin[:2] == [1 / 3, 2 / 3]  # the warm-up as ever
    assert lin[2] == 1.0  # p = 0
    assert lin[6] == pytest.approx(0.1 + 0.9 * 0.5)  # p = 1/2: 0.55
    assert lin[10] == pytest.approx(0.1) and lin[11] == pytest.approx(0.1)  # the floor, kept
    cos = [lr_factor(s, 2, "cosine", 10, 0.0) for s in range(11)]
    assert cos[2] == 1.0
    assert cos[4] == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))  # p = 1/4: 0.854
    assert cos[6] == pytest.approx(0.5)  # p = 1/2
    assert cos[10] == pytest.approx(0.0)


def test_an_unknown_schedule_is_named():
    with pytest.raises(ValueError, match="lr_schedule='step'.*constant, linear, cosine"):
        lr_factor(0, 0, "step", 10)


def test_the_fsdp_backend_steps_its_learning_rate_by_the_schedule():
    from rlpost.trainers.engine_config import EngineConfig
    from rlpost.trainers.fsdp.common import FSDPBackend

    model = torch.nn.Linear(2, 1)
    optim = EngineConfig(
        model_path="unused", lr=0.1, lr_warmup_steps=1, lr_schedule="linear", lr_decay_steps=5
    )
    backend = FSDPBackend(model, 1, lambda b: [b], lambda mb: mb, optim)
    assert backend.scheduler is not None
    seen = []
    for _ in range(7):
        seen.append(backend.scheduler.get_last_lr()[0])
        backend.optimizer.step()  # no gradients: nothing moves
        backend.scheduler.step()
    # 0.1 x [1/2, 1, 3/4, 1/2, 1/4, 0, 0]: warm-up 1, then 4 steps down to 0
    assert seen == pytest.approx([0.05, 0.1, 0.075, 0.05, 0.025, 0.0, 0.0])


def test_the_plan_hands_the_run_s_optimizer_steps_to_the_engines():
    from rlpost.config.compose import compose
    from rlpost.device import resolve_device
    from rlpost.plan.engines import trainer_engine_config

    cfg = compose([
        "trainer.lr_schedule=cosine", "trainer.lr_min_ratio=0.1", "trainer.total_steps=40",
        "algo.epochs=2", "algo.mini_batches=2", "trainer.device=cpu",
    ])  # fmt: skip
    engine = trainer_engine_config(cfg, "policy", "m", resolve_device("cpu"))
    # lr_decay_steps: 40 steps x 2 epochs x 2 mini-batches = 160 (the FSDP2 backend reads
    # the engine config itself)
    assert (engine.lr_schedule, engine.lr_decay_steps, engine.lr_min_ratio) == ("cosine", 160, 0.1)
    with pytest.raises(Exception, match="lr_min_ratio"):
        compose(["trainer.lr_min_ratio=1.5"])
