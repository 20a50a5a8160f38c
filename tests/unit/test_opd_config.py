"""algo=opd's config: a teacher exactly when the preset uses one, its vocabulary the
student's (a config error before Ray starts, naming teacher.path and what to change),
and its trainer group: a frozen policy on teacher.path, placed like the reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlpost.config.compose import compose
from rlpost.config.schema import ConfigError
from rlpost.plan.plan import build_plan
from rlpost.plan.teacher import check_teacher, vocab_problems
from rlpost.workers.placement import bundles


def tokenizer_folder(path: Path, tokenizer) -> Path:
    """A model folder as far as the checks read it: config.json and the tokenizer."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def same_vocab(tmp_path_factory) -> Path:
    from rlpost.models.tiny import build_tokenizer

    return tokenizer_folder(tmp_path_factory.mktemp("teacher") / "same", build_tokenizer())


@pytest.fixture(scope="module")
def other_vocab(tmp_path_factory) -> Path:
    from rlpost.models.archs import build_tokenizer  # byte-level BPE, 512 tokens

    return tokenizer_folder(tmp_path_factory.mktemp("teacher") / "other", build_tokenizer())


def problems_of(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as err:
        compose(overrides)
    return err.value.problems


def test_opd_needs_a_teacher_and_only_opd_takes_one():
    (problem,) = problems_of(["algo=opd"])
    assert problem.startswith("teacher.path=null: algo=opd distils")
    assert "teacher.path=outputs/<a grpo run>/final" in problem
    (problem,) = problems_of(["algo=grpo", "teacher.path=/models/teacher"])
    assert problem == (
        "teacher.path=/models/teacher: only algo=opd uses a teacher, not algo=grpo; drop "
        "teacher.path, or choose algo=opd"
    )


def test_dynamic_sampling_needs_the_task_advantage_under_opd():
    base = ["algo=opd", "teacher.path=/t", "algo.dynamic_sampling.enabled=true"]
    (problem,) = problems_of(base)
    assert problem.startswith("algo.dynamic_sampling.enabled=true: it drops the groups")
    cfg = compose([*base, "algo.opd.task_advantage=true"])
    assert cfg.algo.opd.task_advantage and cfg.algo.opd.kl_coef == 1.0


def test_the_preset_and_its_keys():
    cfg = compose(["algo=opd", "teacher.path=/t", "algo.opd.kl_coef=0.5"])
    assert cfg.algo.name == "opd" and cfg.algo.needs_teacher
    assert cfg.algo.opd.kl_coef == 0.5 and not cfg.algo.opd.task_advantage
    assert not cfg.algo.needs_reference  # the teacher is not the KL loss's reference
    (problem,) = problems_of(["algo=opd", "teacher.path=/t", "algo.opd.kl_coef=0"])
    assert problem.startswith("algo.opd.kl_coef=0")


def test_a_teacher_with_the_students_vocabulary_passes(same_vocab):
    assert check_teacher(compose(["algo=opd", f"teacher.path={same_vocab}"])) == []


def test_a_teacher_with_another_vocabulary_is_a_config_error(other_vocab):
    cfg = compose(["algo=opd", f"teacher.path={other_vocab}"])
    with pytest.raises(ConfigError) as err:
        build_plan(cfg)  # before Ray starts
    (problem,) = err.value.problems
    assert problem.startswith(
        f"teacher.path={other_vocab}: its tokenizer's vocabulary (512 tokens) is not the "
        "built-in 'tiny' model's (104 tokens)"
    )
    assert "give a teacher of the student's model family" in problem
    assert "or change model.path to a student with the teacher's tokenizer" in problem


def test_a_student_folder_is_compared_with_its_own_tokenizer(same_vocab, other_vocab):
    # the student is a model folder with the BPE tokenizer; the char-level teacher differs
    cfg = compose([f"model.path={other_vocab}", "algo=opd", f"teacher.path={same_vocab}"])
    (problem,) = check_teacher(cfg)
    assert f"is not model.path={other_vocab}'s (512 tokens)" in problem
    cfg = compose([f"model.path={other_vocab}", "algo=opd", f"teacher.path={other_vocab}"])
    assert check_teacher(cfg) == []


def test_a_reward_model_as_teacher_is_a_config_error_naming_its_head(tmp_path):
    from rlpost.models.tiny import build_tokenizer

    folder = tokenizer_folder(tmp_path / "rm", build_tokenizer())  # the student's vocabulary
    config = {"model_type": "qwen2", "architectures": ["Qwen2ForSequenceClassification"]}
    (folder / "config.json").write_text(json.dumps(config))
    cfg = compose(["algo=opd", f"teacher.path={folder}"])
    with pytest.raises(ConfigError) as err:
        build_plan(cfg)  # before Ray starts
    (problem,) = err.value.problems
    assert problem.startswith(
        f"teacher.path={folder}: its config.json names Qwen2ForSequenceClassification, a "
        "sequence-classification head"
    )
    assert "...ForCausalLM" in problem


def test_the_vocabulary_problem_names_the_tokens_that_differ():
    student = {"a": 0, "b": 1, "c": 2}
    teacher = {"a": 0, "b": 2, "c": 1, "d": 3}
    (problem,) = vocab_problems("/t", teacher, student, "the student's")
    # b and c swapped ids, d is the teacher's only; sorted by the student's id
    assert "3 tokens differ ('b': id 1 for the student, id 2 for the teacher; " in problem
    assert "'c': id 2 for the student, id 1 for the teacher; " in problem
    assert "'d': absent for the student, id 3 for the teacher)" in problem
    assert vocab_problems("/t", student, dict(student), "the student's") == []


def test_a_teacher_folder_without_a_model_is_refused(tmp_path):
    (problem,) = check_teacher(compose(["algo=opd", f"teacher.path={tmp_path}"]))
    assert problem.startswith(f"teacher.path={tmp_path}: no HF model (config.json)")
    # a hub id is not downloaded to be checked
    assert check_teacher(compose(["algo=opd", "teacher.path=org/teacher-7b"])) == []


def test_the_teacher_is_a_frozen_group_on_its_own_model_placed_like_the_reference(same_vocab):
    cfg = compose(["algo=opd", f"teacher.path={same_vocab}", "algo.kl.loss_coef=0.01"])
    plan = build_plan(cfg)
    assert plan.roles == ("policy", "reference", "teacher")
    teacher = plan.trainer_engine("teacher", "/student")
    reference = plan.trainer_engine("reference", "/student")
    assert teacher.model_path == str(same_vocab) and reference.model_path == "/student"
    assert not teacher.trainable and teacher.lr_warmup_steps == 0
    assert plan.trainer_engine("policy", "/student").trainable
    found = bundles(cfg, {"num_gpus": 1})
    assert found["teacher"] == found["reference"] == [{"CPU": 1.0, "GPU": 1.0}]
    assert "teacher" not in bundles(compose(["algo=grpo"]), {})


def test_the_cli_refuses_another_vocabulary_before_ray_starts(tmp_path, other_vocab):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "rlpost.main", "algo=opd", f"teacher.path={other_vocab}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "Ray instance" not in proc.stderr
    assert f"teacher.path={other_vocab}: its tokenizer's vocabulary (512 tokens)" in proc.stderr
