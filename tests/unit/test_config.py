"""Config composition (Hydra + dotted overrides), schema validation and the CLI's error path."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlpost.config.compose import compose, from_dict
from rlpost.config.groups import AlgoConfig
from rlpost.config.schema import ConfigError, validate

REPO = Path(__file__).resolve().parents[2]


def _problems(overrides: list[str]) -> tuple[list[str], str]:
    with pytest.raises(ConfigError) as info:
        compose(overrides)
    return info.value.problems, str(info.value)


def test_yaml_values_override_the_schema_and_absent_keys_take_its_default(tmp_path, monkeypatch):
    import shutil

    from rlpost.config.compose import compose_dict, config_dir
    from rlpost.config.groups import DataConfig, RewardConfig

    # The shipped presets: a key in the YAML wins over the schema, a key absent from
    # every YAML of the composition comes from the schema.
    raw = compose_dict([])
    assert "prompts_per_step" not in raw["data"] and raw["reward"] == {"fn": "arith"}
    cfg = compose([])
    assert RewardConfig().weights == {}  # schema: the function's own weights
    assert cfg.reward.weights == {}  # reward/arith.yaml: the function's default_weights hold
    assert cfg.data.prompts_per_step == DataConfig().prompts_per_step == 32
    # A preset that sets a key to something else than the schema: dapo's clip_high.
    assert compose(["algo=dapo"]).algo.policy_loss.clip_high == 0.28
    assert compose([]).algo.policy_loss.clip_high == 0.2  # grpo.yaml leaves it to the schema
    # The same key from both sources: a copy of configs/ whose default data preset
    # sets prompts_per_step to 5 (schema: 32) and leaves val_size to the schema (200).
    shutil.copytree(config_dir(), tmp_path / "configs")
    (tmp_path / "configs/data/arith.yaml").write_text("prompts_per_step: 5\n")
    monkeypatch.setenv("RLPOST_CONFIG_DIR", str(tmp_path / "configs"))
    cfg = compose([])
    assert cfg.data.prompts_per_step == 5
    assert cfg.data.val_size == DataConfig().val_size == 200
    # ... and a command-line value wins over both.
    assert compose(["data.prompts_per_step=3"]).data.prompts_per_step == 3


def test_dotted_overrides_apply_with_their_types():
    cfg = compose(
        [
            "trainer.logger=[console,wandb]",
            "rollout.temperature=0.7",
            "trainer.total_steps=20",
            "trainer.lr=1",  # an int where a float is expected becomes 1.0
            "algo.policy_loss.clip_high=0.28",
            "model.path=/models/qwen",
        ]
    )
    assert cfg.trainer.logger == ["console", "wandb"]
    assert cfg.rollout.temperature == 0.7
    assert cfg.trainer.total_steps == 20 and isinstance(cfg.trainer.total_steps, int)
    assert cfg.trainer.lr == 1.0 and isinstance(cfg.trainer.lr, float)
    assert cfg.algo.policy_loss.clip_high == 0.28
    assert cfg.algo.policy_loss.clip_low == 0.2  # untouched sibling keeps its default
    assert cfg.model.path == "/models/qwen"


def test_group_choice_selects_a_preset():
    cfg = compose(["algo=sft"])
    assert cfg.algo.name == "sft"
    assert cfg.algo.epochs == 1


def test_one_error_lists_every_bad_key():
    problems, message = _problems(
        [
            "trainer.foo=1",  # unknown key
            "rollout.temperature=abc",  # wrong type
            "trainer.total_steps=1.5",  # wrong type (int)
            "rollout.n=0",  # out of range (ge=1)
            "rollout.top_p=1.5",  # out of range (le=1)
            "trainer.logger=[console,bogus]",  # bad choice inside a list
            "algo.policy_loss.bar=2",  # unknown key in a nested group
        ]
    )
    expected = {
        "trainer.foo": "unknown key",
        "rollout.temperature='abc'": "expected a number",
        "trainer.total_steps=1.5": "expected an integer",
        "rollout.n=0": "must be >= 1",
        "rollout.top_p=1.5": "must be <= 1",
        "trainer.logger[1]='bogus'": "expected one of 'console', 'jsonl', 'wandb'",
        "algo.policy_loss.bar": "unknown key",
    }
    assert len(problems) == len(expected), problems
    for key, why in expected.items():
        (line,) = [p for p in problems if p.startswith(key + ":")]
        assert why in line
        assert line in message
    # an unknown key names what the group accepts
    (foo,) = [p for p in problems if p.startswith("trainer.foo")]
    assert "total_steps" in foo and "micro_batch_size" in foo


def test_unknown_top_level_group_is_reported():
    problems, _ = _problems(["foo.bar=1"])
    assert len(problems) == 1
    assert problems[0].startswith("foo: unknown config group")
    assert "algo, model, rollout, trainer, data, reward" in problems[0]


def test_unknown_preset_lists_the_available_ones():
    from rlpost.config.compose import config_dir

    problems, message = _problems(["algo=nope"])
    presets = sorted(p.stem for p in (config_dir() / "algo").glob("*.yaml"))
    assert {"grpo", "dapo", "ppo", "gspo", "gdpo", "rloo", "reinforce_pp", "dr_grpo", "sft"} <= set(
        presets
    )
    assert problems == [f"algo=nope: no such preset; available: {', '.join(presets)}"]
    assert ", ".join(presets) in message


def test_files_data_without_files_reports_both_missing_keys():
    problems, message = _problems(["data=files"])
    assert len(problems) == 2
    assert problems[0].startswith("data.train_files: required")
    assert problems[1].startswith("data.val_files: required")
    assert "data.train_files=..." in message and "data.val_files=..." in message


def test_files_data_with_files_composes():
    # the example from `python -m rlpost.main --help`
    cfg = compose(
        [
            "model.path=Qwen/Qwen2.5-0.5B-Instruct",
            "data=files",
            "data.train_files=[train.jsonl]",
            "data.val_files=[val.jsonl]",
            "reward=custom",
            "reward.fn=my_reward.py:score",
        ]
    )
    assert cfg.data.train_files == ["train.jsonl"]
    assert cfg.data.val_files == ["val.jsonl"]
    assert cfg.reward.fn == "my_reward.py:score"


def test_one_path_is_a_list_of_one():
    # verl accepts data.train_files=mine.jsonl; so does rlpost
    cfg = compose(["data=files", "data.train_files=mine.jsonl", "data.val_files=val.parquet"])
    assert cfg.data.train_files == ["mine.jsonl"] and cfg.data.val_files == ["val.parquet"]


def test_files_without_data_files_preset_is_an_error_naming_both_keys():
    # without data=files the built-in task would train and the files be ignored
    problems, message = _problems(
        ["data.train_files=[mine.jsonl]", "data.val_files=[mine_val.jsonl]"]
    )
    assert problems == [
        "data.train_files=['mine.jsonl']: data.name=arith is the built-in task and would "
        "ignore these files; add data=files to train on them",
        "data.val_files=['mine_val.jsonl']: data.name=arith is the built-in task and would "
        "ignore these files; add data=files to train on them",
    ]


def test_batch_must_split_over_ranks():
    # 3 prompts x 3 samples = 9 rows; 9 % (2 ranks x 1 mini-batch) = 1
    problems, _ = _problems(["data.prompts_per_step=3", "rollout.n=3", "trainer.world_size=2"])
    assert len(problems) == 1
    assert "= 9 must divide by" in problems[0]
    assert "trainer.world_size x algo.mini_batches = 2" in problems[0]
    # 3 x 4 = 12 rows split over 2 ranks x 2 mini-batches = 4: 12 % 4 = 0
    cfg = compose(
        [
            "data.prompts_per_step=3",
            "rollout.n=4",
            "trainer.world_size=2",
            "algo.mini_batches=2",
        ]
    )
    assert cfg.trainer.world_size == 2
    # 12 % (2 x 3 = 6) = 0 as well, but 12 % (2 x 5 = 10) = 2
    problems, _ = _problems(
        ["data.prompts_per_step=3", "rollout.n=4", "trainer.world_size=2", "algo.mini_batches=5"]
    )
    assert "= 12 must divide by" in problems[0] and "= 10" in problems[0]


def test_sft_skips_the_rollout_split_check():
    # 3 prompts x rollout.n 8 = 24 samples would not split over 5 ranks; sft samples nothing
    cfg = compose(["algo=sft", "data.prompts_per_step=3", "trainer.world_size=5"])
    assert cfg.algo.name == "sft"


def test_which_algorithms_need_the_old_log_probs_before_the_update():
    # ppo and reinforce_pp put a KL penalty in the reward, computed before the update;
    # a second epoch or mini-batch needs the log-probs from before the first step.
    # The others take the old log-probs from the update's own forward.
    def needs(*overrides: str) -> bool:
        return compose(list(overrides)).algo.old_logprobs_before_update

    assert [needs(f"algo={a}") for a in ("grpo", "dapo", "gspo", "rloo", "gdpo")] == [False] * 5
    assert needs("algo=ppo") and needs("algo=reinforce_pp")
    assert needs("algo.epochs=2") and needs("algo.mini_batches=2")
    assert not needs(
        "algo.off_policy.is_cap=3.0", "algo.kl.loss_coef=0.1", "algo.entropy_coef=0.01"
    )


def test_model_small_is_the_30m_preset_without_a_warm_up():
    # random weights on purpose (configs/model/small.yaml says why); the rest as model=tiny
    small, tiny = compose(["model=small"]).model, compose([]).model
    assert small.preset == "small" and small.path is None
    assert small.warmup.steps == 0 and tiny.warmup.steps == 2000
    assert small.lora == tiny.lora and small.dtype == tiny.dtype


def test_malformed_override_is_named():
    problems, _ = _problems(["trainer.total_steps"])
    assert len(problems) == 1
    assert "'trainer.total_steps'" in problems[0] and "key=value" in problems[0]
    problems, _ = _problems(["=3"])
    assert "'=3'" in problems[0]


def test_required_field_without_default():
    # one line for the one missing key, and nothing from the dataclass constructor
    _, problems = validate(AlgoConfig, {}, "algo")
    assert len(problems) == 1
    assert problems[0].startswith("algo.name: required (str, one of grpo, dapo, ppo")


def test_missing_group_in_a_raw_dict():
    with pytest.raises(ConfigError) as info:
        from_dict({"algo": {"name": "grpo"}})
    missing = {p.split(":")[0] for p in info.value.problems}
    assert missing == {"model", "rollout", "trainer", "data", "reward"}


def test_cli_config_error_exits_2_and_names_every_key():
    start = time.perf_counter()
    # -c so that the same process can report whether heavy modules were imported
    code = (
        "import sys; from rlpost.main import main; rc = main(sys.argv[1:]); "
        "heavy = sorted(m for m in ('ray', 'vllm') if m in sys.modules); "
        "print('heavy:', heavy, file=sys.stderr); sys.exit(rc)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "trainer.foo=1", "rollout.n=0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    elapsed = time.perf_counter() - start
    assert proc.returncode == 2, proc.stderr
    assert "trainer.foo: unknown key" in proc.stderr
    assert "rollout.n=0: must be >= 1" in proc.stderr
    assert "heavy: []" in proc.stderr  # no Ray, no vLLM for a config error
    assert elapsed < 20


def test_cli_module_entry_point():
    proc = subprocess.run(
        [sys.executable, "-m", "rlpost.main", "trainer.foo=1", "rollout.n=0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "trainer.foo" in proc.stderr and "rollout.n" in proc.stderr
    help_proc = subprocess.run(
        [sys.executable, "-m", "rlpost.main", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert help_proc.returncode == 0
    assert "usage: python -m rlpost.main" in help_proc.stdout


def test_configuration_page_documents_every_key():
    # docs/configuration.md's key table is generated from the schema (the site
    # renders it at build time); rewrite the committed copy with
    # `python docs/hooks.py` when a key changes.
    import re
    from pathlib import Path

    from rlpost.config.compose import keys_markdown

    page = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    table = re.search(r"<!-- keys:start -->\n(.*)\n<!-- keys:end -->", page, re.S)
    assert table is not None
    assert table.group(1) == keys_markdown()


def test_calc_task_without_its_tool_is_an_error():
    problems, _ = _problems(["data=calc"])
    assert problems == [
        "data.name=calc: the calc task is solved by calling the multiply tool; "
        "use agent=calculator (or set agent.tools=[multiply])"
    ]
    assert compose(["agent=calculator"]).data.name == "calc"


def test_adapter_sync_without_lora_is_an_error_naming_the_rank():
    # model.lora.rank=0 trains the full model: there is no adapter to send.
    with pytest.raises(ConfigError) as err:
        compose(["rollout.lora_sync=adapter"])
    (problem,) = err.value.problems
    assert problem.startswith("rollout.lora_sync=adapter: model.lora.rank=0 trains the full model")
    assert "set model.lora.rank (e.g. model.lora.rank=8)" in problem
    assert compose(["rollout.lora_sync=adapter", "model.lora.rank=8"]).model.lora.rank == 8


def test_compiled_layers_are_the_fsdp_trainers():
    problems, _ = _problems(["trainer=megatron", "trainer.compile=true"])
    assert (
        "trainer.compile=true with trainer=megatron: compiling the decoder layers and "
        "log-prob kernels is the fsdp trainer's; set trainer.compile=false"
    ) in problems
    # and reaches the fsdp engine's config
    from rlpost.device import resolve_device
    from rlpost.plan.engines import trainer_engine_config

    cfg = compose(["trainer.compile=true"])
    engine = trainer_engine_config(cfg, "policy", "m", resolve_device("cpu"))
    assert getattr(engine, "compile", None) is True
