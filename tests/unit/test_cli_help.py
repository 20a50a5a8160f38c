"""What ``python -m rlpost.main`` tells a user before anything runs: every group
with its presets, every key with its default, and hints for the ways a list or
a flag is commonly mistyped."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlpost.config.compose import compose
from rlpost.config.schema import ConfigError
from rlpost.main import main

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_help_lists_every_group_and_preset_with_the_defaults_marked(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for group in ("algo", "model", "rollout", "trainer", "data", "reward", "agent"):
        presets = sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))
        (line,) = [x for x in out.splitlines() if x.strip().startswith(f"{group} ")]
        assert [p.rstrip("*") for p in line.split(None, 1)[1].split(", ")] == presets
    assert "agent    calculator, none*" in out and "algo     cispo, dapo, " in out
    assert "gdpo, grpo*, gspo" in out


def test_help_keys_shows_the_default_runs_values(capsys):
    assert main(["--help-keys"]) == 0
    rows = {line.split()[0]: line.split()[2] for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows["trainer.total_steps"] == "200" and rows["algo.name"] == "grpo"
    assert rows["data.prompts_per_step"] == str(compose([]).data.prompts_per_step)


@pytest.mark.parametrize(
    "args, hint",
    [
        (["trainer.logger=console,jsonl"], "trainer.logger=[console,jsonl]"),
        (["trainer.logger=[console,", "jsonl]"], "split by the shell: write key=[a,b]"),
        (["--help-key"], "did you mean --help-keys?"),
    ],
)
def test_a_mistyped_list_or_flag_gets_the_right_spelling(args, hint):
    with pytest.raises(ConfigError, match=hint.replace("[", r"\[").replace("?", r"\?")):
        compose(args)
