"""What the run plan refuses before Ray starts: an engine length past the model's
positions, a device the machine lacks -- config errors (exit 2) that name what
works, not a traceback from deep inside a worker."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rlpost.config.compose import compose
from rlpost.config.schema import ConfigError
from rlpost.plan.checks import check_model_length, model_positions
from rlpost.plan.plan import build_plan


def test_an_engine_length_past_the_built_in_models_positions_is_refused():
    # rollout.max_tokens=128 asks for max_model_len >= 64 + 128 = 192: 512 passes the
    # config check, but the built-in model has 256 positions.
    cfg = compose(["rollout.max_tokens=128", "rollout.max_model_len=512"])
    assert model_positions(cfg) == 256
    with pytest.raises(ConfigError) as err:
        build_plan(cfg)
    (problem,) = err.value.problems
    assert problem.startswith("rollout.max_model_len=512: the built-in 'tiny' model has 256")
    assert "data.max_prompt_tokens + rollout.max_tokens = 192" in problem
    assert (
        check_model_length(compose(["rollout.max_tokens=128", "rollout.max_model_len=256"])) == []
    )


def test_the_built_in_positions_are_the_builders_and_the_check_imports_no_transformers():
    from rlpost.models.tiny import build_config, build_tokenizer
    from rlpost.models.vl import TEXT

    assert (
        model_positions(compose([]))
        == build_config("tiny", build_tokenizer()).max_position_embeddings
    )
    vl = compose(["model.preset=tiny_vl"])
    assert model_positions(vl) == TEXT["max_position_embeddings"] == 1024
    # The check itself, in a fresh interpreter: the built-in model's positions come
    # without transformers, whose import (~2.5 s) the driver makes while Ray starts.
    code = (
        "import sys\n"
        "from rlpost.config.compose import compose\n"
        "from rlpost.plan.checks import check_model_length\n"
        "print(check_model_length(compose(['rollout.max_model_len=512', 'rollout.max_tokens=128'])))\n"
        "print('transformers' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    problems, imported = out.stdout.strip().splitlines()
    assert "has 256 positions" in problems and imported == "False"


def test_a_model_directorys_positions_come_from_its_config(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "qwen2_vl", "text_config": {"max_position_embeddings": 128}})
    )
    cfg = compose([f"model.path={tmp_path}", "rollout.max_model_len=160"])
    assert model_positions(cfg) == 128
    assert "has 128 positions" in check_model_length(cfg)[0]
    hub = compose(["model.path=Org/some-model", "rollout.max_model_len=4096"])
    assert model_positions(hub) is None and check_model_length(hub) == []


def test_a_device_the_machine_lacks_is_a_config_error_without_a_traceback(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = subprocess.run(
        [sys.executable, "-m", "rlpost.main", "trainer.device=cuda", "reward.fn=missing.py:f"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    # both problems at once, the device's naming the fix
    assert (
        "trainer.device=cuda but no CUDA device is visible; use trainer.device=cpu" in proc.stderr
    )
    assert "file 'missing.py' does not exist" in proc.stderr


def _rows_file(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_missing_image_file_is_a_config_error_naming_file_and_row(tmp_path):
    from PIL import Image

    Image.new("RGB", (8, 8)).save(tmp_path / "red.png")
    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "colour?"}]}]
    rows = [
        {"prompt": prompt, "images": ["red.png"], "answer": "red"},
        {"prompt": prompt, "images": ["imgs/missing.png"], "answer": "red"},
    ]
    data = _rows_file(tmp_path / "train.jsonl", rows)
    cfg = compose(["data=files", f"data.train_files=[{data}]", f"data.val_files=[{data}]"])
    with pytest.raises(ConfigError) as err:
        build_plan(cfg)
    text = str(err.value)
    assert f"data.train_files: {data} row 1: image file 'imgs/missing.png' does not exist" in text
    assert f"data.val_files: {data} row 1:" in text  # the held-out file is checked too


def test_the_malformed_row_warning_names_its_file(tmp_path, caplog):
    from rlpost.plan.inputs import load_data

    good = {"prompt": "1+1=", "answer": "2"}
    train = _rows_file(tmp_path / "train.jsonl", [good, {"question": "x"}, good])
    val = _rows_file(tmp_path / "val.jsonl", [good, good, {"prompt": ""}])
    cfg = compose(["data=files", f"data.train_files=[{train}]", f"data.val_files=[{val}]"])
    with caplog.at_level("WARNING"):
        rows, held_out, dropped = load_data(cfg)
    assert (len(rows), len(held_out), dropped) == (2, 2, 2)
    assert f"data.train_files: {train}: skipped 1 malformed of 3 rows" in caplog.text
    assert f"data.val_files: {val}: skipped 1 malformed of 3 rows" in caplog.text
    assert "row 1: row has no 'prompt' field" in caplog.text


def test_an_agent_program_takes_rows_without_a_prompt(tmp_path):
    from rlpost.data.rows import DataError
    from rlpost.plan.inputs import load_data

    rows = [{"question": "1+1=", "answer": "2"}, {"prompt": ""}, {"question": "2+2="}]
    train = _rows_file(tmp_path / "train.jsonl", rows)
    args = ["data=files", f"data.train_files=[{train}]", f"data.val_files=[{train}]"]
    # without a program, a row needs its prompt
    with pytest.raises(DataError, match="no valid training rows"):
        load_data(compose(args))
    program = "agent.program=tests/integration/programs/tool_agent.py:run"
    kept, held_out, dropped = load_data(compose([*args, program]))
    # the program gets the rows as they are; a prompt it has is still checked
    assert kept == [rows[0], rows[2]] and held_out == kept and dropped == 2
