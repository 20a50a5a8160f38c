"""The pre-warmed bases rlpost ships: each is current for its settings' cache key, a
run on those settings starts from its bytes without a warm-up, and
``model.warmup.shipped=false`` warms up on the machine instead."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlpost.config.compose import compose
from rlpost.models.warmup import SHIPPED_DIR, WARMUP_RECORD, builtin_model, warmup_key

SHIPPED = sorted(p for p in SHIPPED_DIR.iterdir() if p.is_dir())
FILES = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}


def test_rlpost_ships_the_arith_and_calc_bases():
    assert {p.name for p in SHIPPED} >= {
        warmup_key(compose([])),
        warmup_key(compose(["agent=calculator"])),
    }


@pytest.mark.parametrize(
    ("theirs", "ours"),
    [
        (["data=files", "data.train_files=[a.jsonl]", "data.val_files=[b.jsonl]"], []),
        (
            ["algo=rm", "data=files", "data.train_files=[a.jsonl]", "data.val_files=[b.jsonl]"],
            ["algo=rm", "data=arith_pref"],
        ),
    ],
)
def test_a_run_on_a_users_files_starts_from_the_built_in_tasks_shipped_base(theirs, ours):
    # the built-in model is warmed up on the arith task either way; a user's files
    # take its defaults, so algo=rm data=files starts from the shipped 0.9 base
    # instead of warming one up on the machine for minutes
    assert warmup_key(compose(theirs)) == warmup_key(compose(ours))
    assert warmup_key(compose(theirs)) in {p.name for p in SHIPPED}


@pytest.mark.parametrize("base", SHIPPED, ids=lambda p: p.name)
def test_each_shipped_base_is_current_for_its_settings(base):
    record = json.loads((base / WARMUP_RECORD).read_text())
    # A change to the warm-up's defaults or to its cache key changes the key its
    # settings compose to: rebuild with python -m rlpost.models.ship <overrides>.
    assert warmup_key(compose(record["overrides"])) == base.name, record
    assert FILES <= {p.name for p in base.iterdir()}
    assert record["accuracy"] >= record["target_accuracy"]


class NoWarmUp:
    def __call__(self, *args):
        raise AssertionError("a shipped base was warmed up again")


class WarmUpCalled(Exception):
    pass


def test_a_run_on_shipped_settings_starts_from_the_shipped_bytes(tmp_path):
    cfg = compose([f"model.cache_dir={tmp_path}"])
    out = Path(builtin_model(cfg, NoWarmUp()))
    shipped = SHIPPED_DIR / warmup_key(cfg)
    assert out == tmp_path / shipped.name
    for name in FILES | {WARMUP_RECORD}:
        assert (out / name).read_bytes() == (shipped / name).read_bytes(), name
    assert [p.name for p in tmp_path.iterdir()] == [shipped.name]  # no copy left beside it
    assert builtin_model(cfg, NoWarmUp()) == str(out)  # then the cache


def test_shipped_false_warms_up_under_a_key_of_its_own(tmp_path):
    here = compose([f"model.cache_dir={tmp_path}", "model.warmup.shipped=false"])
    assert warmup_key(here) != warmup_key(compose([]))

    def make_trainer(path, lr, warm):
        raise WarmUpCalled(path)

    with pytest.raises(WarmUpCalled):
        builtin_model(here, make_trainer)
    assert list(tmp_path.iterdir()) == []  # the failed warm-up's initial copy is gone
