"""What ``trainer.ulysses`` refuses before Ray starts, each naming the key to change."""

from __future__ import annotations

import json

import pytest

from rlpost.config.compose import compose
from rlpost.config.schema import ConfigError
from rlpost.plan.checks import check_ulysses_model


def _problems(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as err:
        compose(overrides)
    return err.value.problems


def test_ulysses_must_divide_the_ranks_and_run_on_fsdp():
    (problem,) = _problems(["trainer.world_size=2", "trainer.ulysses=3"])
    assert problem.startswith("trainer.ulysses=3: must divide trainer.world_size=2")
    problems = _problems(["trainer=megatron", "trainer.ulysses=2", "trainer.world_size=2"])
    assert any("megatron splits sequences with trainer.megatron.cp" in p for p in problems)
    problems = _problems(
        ["algo=rm", "data=arith_pref", "trainer.world_size=2", "trainer.ulysses=2"]
    )
    assert any(p.startswith("trainer.ulysses=2 with algo=rm") for p in problems)
    # a layout that works composes
    assert compose(["trainer.world_size=4", "trainer.ulysses=2"]).trainer.ulysses == 2


def test_the_models_heads_must_split_over_the_ranks(tmp_path):
    def folder(**text) -> str:
        path = tmp_path / str(len(list(tmp_path.iterdir())))
        path.mkdir()
        (path / "config.json").write_text(json.dumps({"model_type": "qwen2", **text}))
        return str(path)

    def check(path: str, n: int) -> list[str]:
        cfg = compose([f"model.path={path}", f"trainer.world_size={n}", f"trainer.ulysses={n}"])
        return check_ulysses_model(cfg)

    # 12 query heads, 4 key/value heads: 2 and 4 divide both; 8 is a multiple of 4
    # (each rank a copy of one key/value head) but does not divide 12
    gqa = folder(num_attention_heads=12, num_key_value_heads=4)
    assert check(gqa, 2) == [] and check(gqa, 4) == []
    (problem,) = check(gqa, 8)
    assert problem.endswith("its 12 attention heads do not split over 8 ranks")
    # 6 key/value heads over 4 ranks: neither divides the other
    (problem,) = check(folder(num_attention_heads=12, num_key_value_heads=6), 4)
    assert "its 6 key/value heads do not split over 4 ranks" in problem
    layers = ["full_attention", "sliding_attention"]
    sliding = folder(num_attention_heads=4, num_hidden_layers=2, layer_types=layers)
    assert "sliding-window attention layers" in check(sliding, 2)[0]
    # the built-in models: tiny (4 heads, 2 key/value) splits over 2, and the VL model is refused
    assert check_ulysses_model(compose(["trainer.world_size=2", "trainer.ulysses=2"])) == []
    cfg = compose(["model=tiny_vl", "data=shapes", "trainer.world_size=2", "trainer.ulysses=2"])
    assert "vision-language model" in check_ulysses_model(cfg)[0]
