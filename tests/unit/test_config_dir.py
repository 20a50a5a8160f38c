"""A user's folder of presets on the config search path (``--config-dir``,
``$RLPOST_CONFIG_DIR``): searched before the shipped presets, so it adds presets
and replaces those of the same name; a folder that is not there, or holds no
YAML, stops the CLI with exit code 2 and a message naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlpost.config.compose import compose, config_dir, search_path, split_config_dirs
from rlpost.config.schema import ConfigError
from rlpost.main import main

# algo/mine.yaml: the shipped grpo with one change (schema default clip_high 0.2).
MINE = "defaults:\n  - grpo\n  - _self_\npolicy_loss:\n  clip_high: 0.31\n"
# reward/arith.yaml of the same name as a shipped preset, with other weights.
ARITH = "fn: arith\nweights:\n  correctness: 0.25\n  format: 0.75\n"


@pytest.fixture
def user_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv("RLPOST_CONFIG_DIR", raising=False)
    folder = tmp_path / "my_configs"
    (folder / "algo").mkdir(parents=True)
    (folder / "reward").mkdir()
    (folder / "algo" / "mine.yaml").write_text(MINE)
    (folder / "reward" / "arith.yaml").write_text(ARITH)
    return folder


def test_a_new_preset_resolves_and_builds_on_a_shipped_one(user_dir):
    cfg = compose(["--config-dir", str(user_dir), "algo=mine"])
    assert cfg.algo.name == "grpo"  # from the shipped grpo.yaml it lists in its defaults
    assert cfg.algo.policy_loss.clip_high == 0.31
    assert cfg.algo.policy_loss.clip_low == 0.2  # untouched: the schema default
    # --config-dir=PATH is the same option.
    assert compose([f"--config-dir={user_dir}", "algo=mine"]).algo.policy_loss.clip_high == 0.31


def test_a_preset_of_the_same_name_replaces_the_shipped_one(user_dir):
    shipped = compose([]).reward.weights
    cfg = compose(["--config-dir", str(user_dir)])  # reward=arith is the default choice
    assert cfg.reward.weights == {"correctness": 0.25, "format": 0.75} != shipped
    # Without the folder on the path the shipped preset is back.
    assert compose(["reward=arith"]).reward.weights == shipped


def test_the_environment_variable_joins_the_path_after_the_option(user_dir, tmp_path, monkeypatch):
    other = tmp_path / "team_configs"
    (other / "algo").mkdir(parents=True)
    (other / "algo" / "mine.yaml").write_text(MINE.replace("0.31", "0.4"))
    (other / "algo" / "theirs.yaml").write_text(MINE.replace("0.31", "0.5"))
    monkeypatch.setenv("RLPOST_CONFIG_DIR", str(other))
    assert search_path([user_dir]) == [user_dir.resolve(), other.resolve(), config_dir()]
    assert compose(["algo=theirs"]).algo.policy_loss.clip_high == 0.5
    assert compose(["algo=mine"]).algo.policy_loss.clip_high == 0.4
    # the command line's folder comes first: its mine.yaml wins
    assert compose(["--config-dir", str(user_dir), "algo=mine"]).algo.policy_loss.clip_high == 0.31


def test_a_config_yaml_of_the_user_replaces_the_shipped_one(user_dir):
    shipped = (config_dir() / "config.yaml").read_text()
    (user_dir / "config.yaml").write_text(shipped.replace("algo: grpo", "algo: mine"))
    assert compose(["--config-dir", str(user_dir)]).algo.policy_loss.clip_high == 0.31


def test_an_unknown_preset_lists_the_users_and_the_shipped_ones(user_dir):
    with pytest.raises(
        ConfigError, match=r"algo=nope: no such preset; available: .*grpo, gspo, mine"
    ):
        compose(["--config-dir", str(user_dir), "algo=nope"])


def test_help_lists_the_users_presets_and_the_search_path(user_dir, capsys):
    assert main(["--config-dir", str(user_dir), "--help"]) == 0
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.strip().startswith("algo ")]
    assert "grpo*, gspo, mine, opd, ppo" in line
    assert f"  {user_dir.resolve()}\n  {config_dir()}\n" in out


def test_help_keys_shows_the_values_of_the_users_preset(user_dir, capsys):
    assert main(["--config-dir", str(user_dir), "algo=mine", "--help-keys"]) == 0
    rows = {line.split()[0]: line.split()[2] for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows["algo.policy_loss.clip_high"] == "0.31"


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda tmp: tmp / "missing", "no such folder"),
        (lambda tmp: tmp, "holds no YAML"),  # an empty folder
    ],
)
def test_a_bad_config_dir_stops_the_cli_with_exit_code_2(
    tmp_path, monkeypatch, capsys, make, expected
):
    monkeypatch.delenv("RLPOST_CONFIG_DIR", raising=False)
    folder = make(tmp_path)
    for argv in (["--config-dir", str(folder), "algo=grpo"], [f"--config-dir={folder}", "--help"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and f"--config-dir {folder}: {expected}" in err
        assert "algo/my_algo.yaml" in err  # what to put there


def test_a_bad_environment_variable_names_itself(tmp_path, monkeypatch):
    monkeypatch.setenv("RLPOST_CONFIG_DIR", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match=r"RLPOST_CONFIG_DIR=.*missing: no such folder"):
        compose([])


def test_config_dir_without_a_path_is_an_error():
    assert split_config_dirs(["a=1", "--config-dir", "x", "--config-dir=y"]) == (
        ["x", "y"],
        ["a=1"],
    )
    with pytest.raises(ConfigError, match="--config-dir needs a folder"):
        split_config_dirs(["--config-dir", "algo=mine"])
    with pytest.raises(ConfigError, match="--config-dir needs a folder"):
        split_config_dirs(["--config-dir"])
