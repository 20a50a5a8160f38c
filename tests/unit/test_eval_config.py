"""``python -m rlpost.eval``'s config: with ``data=files`` only ``data.val_files`` is needed."""

from __future__ import annotations

import pytest

from rlpost.config.schema import ConfigError
from rlpost.evaluation.run import compose_eval


def test_files_need_only_the_held_out_files():
    cfg = compose_eval(["data=files", "data.val_files=[val.jsonl]", "model.path=org/model"])
    # the training config's checks (columns the reward names) read the held-out rows
    assert cfg.data.train_files == cfg.data.val_files == ["val.jsonl"]


def test_given_training_files_are_kept():
    cfg = compose_eval(
        ["data=files", "data.train_files=[t.jsonl]", "data.val_files=[v.jsonl]", "model.path=m"]
    )
    assert cfg.data.train_files == ["t.jsonl"]


def test_missing_held_out_files_are_named_and_training_files_are_not():
    with pytest.raises(ConfigError) as info:
        compose_eval(["data=files", "model.path=org/model"])
    assert "data.val_files: required" in str(info.value)
    assert "train_files" not in str(info.value)
