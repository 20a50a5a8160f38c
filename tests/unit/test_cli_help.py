"""What ``python -m rlpost.main`` tells a user before anything runs: every group
with its presets, every key with its default, and hints for the ways a list or
a flag is commonly mistyped."""

from __future__ import annotations

import subprocess
import sys
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


def test_help_and_the_run_config_schema_load_without_torch():
    # `rlpost --help` answers in a tenth of a second: neither it nor the run config's
    # schema (rlpost.config.groups, which holds algos' and the engines' settings)
    # imports torch. Run in a fresh interpreter: this one has torch loaded already.
    code = (
        "import contextlib, io, sys\n"
        "from rlpost.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['--help']) == 0\n"
        "import rlpost.config.groups\n"
        "print(sorted(m for m in ('torch', 'transformers', 'vllm', 'ray') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stderr


def test_the_algos_package_loads_every_loss_on_first_use():
    # The package is lazy: importing one module of it loads that module only; the
    # first name taken from the package registers every loss_* module's losses, so a
    # registry read through it is whole. A fresh interpreter, as above.
    code = (
        "from rlpost.algos.policy_loss import POLICY_LOSSES as direct\n"
        "print(*sorted(direct))\n"
        "from rlpost.algos import POLICY_LOSSES\n"
        "print(*sorted(POLICY_LOSSES))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, after = out.stdout.splitlines()
    assert before == "gspo ppo_clip", out.stderr
    assert {"cispo", "clip_cov", "kl_cov", "geo_mean", "gmpo", "sapo", "gspo", "ppo_clip"} <= set(
        after.split()
    )
