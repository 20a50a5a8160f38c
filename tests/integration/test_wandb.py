"""The wandb sink defaults to offline: with ``WANDB_MODE`` unset and no network,
``Tracker`` writes an offline run under the run directory whose history holds
exactly the logged rows. (The CLI wiring of ``trainer.logger=[...,wandb]`` is
checked on the real run in test_custom_data.py.)"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest

pytest.importorskip("wandb")

from rlpost.loop.tracking import Tracker  # noqa: E402

BLOCK = 32768  # the .wandb file is a LevelDB-style log: 32 KiB blocks of chunks
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_wandb_history(path: Path) -> list[dict]:
    """History rows of an offline ``run-*.wandb`` file (wandb >= 0.19 has no
    Python reader of its own). Layout: a 7-byte file header, then chunks with a
    7-byte header (crc32 u32, length u16, type u8) that never cross a block."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, partial, pos = [], b"", 7
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == FULL:
            records.append(chunk)
        elif kind == FIRST:
            partial = chunk
        elif kind == MIDDLE:
            partial += chunk
        elif kind == LAST:
            records.append(partial + chunk)
        else:
            break  # zero padding at the end of the file
    rows = []
    for raw in records:
        record = pb.Record()  # type: ignore[attr-defined]
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            items = record.history.item
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items})
    return rows


def test_wandb_defaults_to_offline_and_logs_history(tmp_path, monkeypatch):
    # setenv then delenv: monkeypatch restores the variables to "unset" after
    # the test, undoing what Tracker sets.
    for name in ("WANDB_MODE", "WANDB_SILENT"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    logged = [
        {"val/accuracy": 0.25},
        {"reward/mean": 0.5, "reward/errors": 3.0, "val/accuracy": 0.5},
        {"reward/mean": 0.75, "reward/errors": 0.0, "actor/pg_loss": float("nan")},
    ]
    tracker = Tracker(run_dir, ["wandb"], total_steps=2, config={"trainer": {"seed": 0}})
    try:
        for step, metrics in enumerate(logged):
            tracker.log(step, metrics)
    finally:
        tracker.close()

    assert not (run_dir / "metrics.jsonl").exists()  # jsonl was not asked for
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((run_dir / "wandb").iterdir())
    (history_file,) = runs[0].glob("run-*.wandb")
    history = read_wandb_history(history_file)
    assert [h["_step"] for h in history] == [0, 1, 2]
    for step, (row, metrics) in enumerate(zip(history, logged)):
        assert row["step"] == step
        for key, value in metrics.items():
            if math.isnan(value):
                assert row[key] == "nan"  # Tracker logs non-finite values as strings
            else:
                assert row[key] == pytest.approx(value)
