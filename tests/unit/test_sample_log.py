"""Rollout dumps: which samples, which fields, written whole."""

from __future__ import annotations

import json

import pytest
import torch

from rlpost.loop.sample_log import SampleLog, sample_rows
from rlpost.rollout.base import Completion, GenerationResult


def completion(text, ids, reason="stop", versions=None):
    return Completion(ids, [0.0] * len(ids), text, reason, versions=versions)


def test_the_first_samples_group_by_group_with_their_rewards_and_advantages():
    rows = [
        {"prompt": "1+1=", "answer": "2"},
        {"prompt": "2+2=", "answer": "4", "data_source": "x"},
    ]
    results = [
        GenerationResult([1], [completion("2", [5, 9], versions=[3, 3]), completion("3", [6])]),
        GenerationResult([1], [completion("4", [7, 8, 9], "length", [2, 3])]),
    ]
    scores = {"total": torch.tensor([1.0, 0.0, 0.5]), "correctness": torch.tensor([1.0, 0.0, 1.0])}
    adv_bt = torch.tensor([[0.7, 0.7, 0.0], [-0.7, 0.0, 0.0], [1.0, 2.0, 6.0]])
    mask_bt = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    out = sample_rows(5, rows, results, scores, 3, adv_bt, mask_bt)
    assert [(s["group"], s["completion"]) for s in out] == [(0, "2"), (0, "3"), (1, "4")]
    assert out[0]["rewards"] == {"total": 1.0, "correctness": 1.0}
    assert out[0]["advantage"] == pytest.approx(0.7)  # (0.7 + 0.7) / 2 tokens
    assert out[2]["advantage"] == pytest.approx(3.0)  # (1 + 2 + 6) / 3
    assert (out[2]["length"], out[2]["finish_reason"], out[2]["policy_version"]) == (3, "length", 2)
    assert out[1]["policy_version"] is None  # the engine did not say
    assert out[2]["data_source"] == "x" and out[0]["answer"] == "2" and out[0]["step"] == 5
    assert len(sample_rows(5, rows, results, scores, 2)) == 2
    assert "advantage" not in sample_rows(5, rows, results, scores, 1)[0]  # validation: none


def test_files_are_written_whole_under_samples(tmp_path):
    log = SampleLog(tmp_path, limit=2)
    path = log.write("val", 20, [{"step": 20, "completion": "x"}, {"step": 20, "completion": "y"}])
    assert path == tmp_path / "samples" / "val_000020.jsonl"
    assert [json.loads(line)["completion"] for line in path.read_text().splitlines()] == ["x", "y"]
    assert [p.name for p in (tmp_path / "samples").iterdir()] == ["val_000020.jsonl"]
