"""The launch form is checked as the CLI checks a command, every problem placed
beside the field that caused it."""

from __future__ import annotations

from pathlib import Path

from rlpost.board.launch import GENERAL, plan, shown, train_command


def test_every_problem_lands_beside_its_field(tmp_path: Path):
    form = {
        "group.algo": "nosuch",
        "key.trainer.total_steps": "-1",
        "extra": "trainer.totl_steps=3\n",
        "name": "../escape",
    }
    checked = plan(tmp_path, form)
    assert not checked.ok
    assert list(checked.problems) == ["name", "group.algo"]  # a bad preset stops compose first
    form["group.algo"] = "dapo"
    checked = plan(tmp_path, form)
    assert set(checked.problems) == {"name", "key.trainer.total_steps", "extra"}
    assert "must be >= 0" in checked.problems["key.trainer.total_steps"][0]
    assert "unknown key" in checked.problems["extra"][0]


def test_a_valid_form_gives_the_cli_command(tmp_path: Path):
    checked = plan(tmp_path, {"group.algo": "dapo", "key.trainer.total_steps": "2", "name": "r1"})
    assert checked.ok and checked.problems == {} and GENERAL not in checked.problems
    assert checked.run_dir == (tmp_path / "r1").resolve()
    line = shown(train_command(checked.overrides))
    assert line == (
        f"python -m rlpost.main algo=dapo trainer.total_steps=2 trainer.run_dir={checked.run_dir}"
    )
