"""trainer=megatron: layouts that cannot run are config errors naming the keys."""

import pytest

from rlpost.config.compose import compose
from rlpost.config.schema import ConfigError
from rlpost.plan.checks import check_megatron_model


def _problems(*overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        compose(["trainer=megatron", *overrides])
    return exc.value.problems


def test_trainer_megatron_composes_with_the_fsdp_keys_and_its_own():
    cfg = compose(["trainer=megatron", "trainer.megatron.tp=2", "trainer.world_size=2"])
    assert cfg.trainer.name == "megatron"
    assert (cfg.trainer.megatron.tp, cfg.trainer.megatron.pp) == (2, 1)
    assert cfg.trainer.lr == compose([]).trainer.lr  # the rest is fsdp.yaml's
    assert check_megatron_model(cfg) == []  # the built-in tiny model: 4 heads, 2 kv heads


def test_world_size_must_divide_by_tp_pp_cp():
    # 3 ranks over tp 2 x pp 1 x cp 1 = 2: one rank would be left over
    (problem,) = _problems(
        "trainer.megatron.tp=2", "trainer.world_size=3", "data.prompts_per_step=3"
    )
    assert problem.startswith("trainer.world_size=3: must divide by trainer.megatron.tp x pp x cp")


def test_every_impossible_setting_is_reported_at_once():
    problems = _problems(
        "trainer.megatron.vpp=2",
        "trainer.megatron.ep=2",
        "trainer.megatron.sequence_parallel=true",
        "model.lora.rank=8",
        "trainer.packing=true",
    )
    text = "\n".join(problems)
    assert "trainer.megatron.vpp=2 with trainer.packing=true: interleaved stages" in text
    assert "trainer.megatron.vpp=2: virtual stages need trainer.megatron.pp > 1" in text
    assert "trainer.megatron.ep=2: expert parallelism needs an MoE model" in text
    assert "trainer.megatron.sequence_parallel=true: needs trainer.megatron.tp > 1" in text
    assert "model.lora.rank=8: trainer=megatron has no LoRA yet" in text


def test_fsdp_only_settings_point_to_the_megatron_keys():
    problems = _problems("model.gradient_checkpointing=true")
    assert problems == [
        "model.gradient_checkpointing=true: an FSDP2 setting; with trainer=megatron use "
        "trainer.megatron.recompute / distributed_optimizer"
    ]


def test_megatron_keys_are_ignored_by_the_fsdp_trainer():
    cfg = compose(["trainer.megatron.tp=2"])  # world_size 1: fine, FSDP does not read them
    assert cfg.trainer.name == "fsdp"


def test_heads_that_do_not_split_over_tp_are_named_before_ray_starts():
    # the 'micro' preset has 2 heads and 1 key/value head: tp=2 cannot split the kv head
    cfg = compose(
        ["trainer=megatron", "model.preset=micro", "trainer.megatron.tp=2", "trainer.world_size=2"]
    )
    (problem,) = check_megatron_model(cfg)
    assert problem.startswith("trainer.megatron.tp=2, pp=1 with the built-in 'micro' model")
    assert "key/value heads (1) must divide by tp" in problem
    three = ["trainer.megatron.pp=3", "trainer.world_size=3", "data.prompts_per_step=3"]
    cfg = compose(["trainer=megatron", *three])
    assert "the layers (4) must divide by pp" in check_megatron_model(cfg)[0]


def test_expert_parallelism_splits_an_moe_models_experts(tmp_path):
    from rlpost.models.archs import build_arch_model

    moe = build_arch_model("Qwen3MoeForCausalLM", tmp_path / "moe")  # 4 experts
    args = ["trainer=megatron", f"model.path={moe}"]
    cfg = compose([*args, "trainer.megatron.ep=2", "trainer.world_size=2"])
    assert check_megatron_model(cfg) == []
    # 3 ranks over 4 experts: not a whole number of experts per rank
    cfg = compose(
        [*args, "trainer.megatron.ep=3", "trainer.world_size=3", "data.prompts_per_step=3"]
    )
    assert "the experts (4) must divide by ep" in check_megatron_model(cfg)[0]
    # megatron-core trains MoE under tensor parallelism only with sequence parallelism
    cfg = compose([*args, "trainer.megatron.tp=2", "trainer.world_size=2"])
    assert "an MoE model with tp > 1 needs sequence_parallel=true" in check_megatron_model(cfg)[0]
    sp = compose([*args, "trainer.megatron.tp=2", "trainer.megatron.sequence_parallel=true",
                  "trainer.world_size=2"])  # fmt: skip
    assert check_megatron_model(sp) == []
    # expert-parallel ranks come out of the data-parallel ones
    (problem,) = _problems(*args, "trainer.megatron.ep=2", "trainer.megatron.tp=2",
                           "trainer.world_size=2")  # fmt: skip
    assert problem.startswith("trainer.world_size=2: must divide by trainer.megatron.tp x pp x ep")


def test_world_size_follows_from_the_parallel_layout_when_not_given():
    # tp x pp x cp = 2 x 1 x 1: two ranks, one data-parallel replica.
    assert compose(["trainer=megatron", "trainer.megatron.tp=2"]).trainer.world_size == 2
    # 2 x 2 x 1 layout times megatron.dp=2: eight ranks.
    cfg = compose(
        ["trainer=megatron", "trainer.megatron.tp=2", "trainer.megatron.pp=2",
         "trainer.megatron.dp=2", "data.prompts_per_step=8"]
    )  # fmt: skip
    assert cfg.trainer.world_size == 8
    assert compose([]).trainer.world_size == 1  # fsdp without a given size: one rank


def test_a_given_world_size_that_does_not_fit_the_layout_stays_an_error():
    with pytest.raises(ConfigError) as err:
        compose(["trainer=megatron", "trainer.megatron.tp=2", "trainer.megatron.dp=2",
                 "trainer.world_size=2"])  # fmt: skip
    assert "trainer.megatron.dp=2: trainer.world_size=2 must equal tp x pp x cp x dp = 4" in str(
        err.value
    )
