"""Checkpoints that are damaged or carry code: fallback, refusal, clear errors."""

from __future__ import annotations

import logging
import os
import random

import pytest
import torch

from rlpost.loop.checkpoint import (
    CheckpointError,
    CheckpointManager,
    load_driver_state,
    pick_checkpoint,
    save_driver_state,
)
from rlpost.trainers.files import UnsafeCheckpointError, safe_torch_load


def _save(manager: CheckpointManager, step: int) -> None:
    def writer(tmp):
        (tmp / "policy").mkdir()
        torch.save({"w": torch.full((64,), float(step))}, tmp / "policy" / "rank0.pt")
        save_driver_state(tmp, {"step": step})

    manager.atomic_write(step, writer)


def test_truncated_newest_checkpoint_falls_back_to_the_previous(tmp_path, caplog):
    manager = CheckpointManager(tmp_path, keep_last=3)
    for step in (2, 4, 6):
        _save(manager, step)
    newest = manager.step_dir(6) / "policy" / "rank0.pt"
    size = newest.stat().st_size
    with open(newest, "r+b") as f:  # a real truncation, as a full disk or a kill leaves it
        f.truncate(size // 2)
    with caplog.at_level(logging.WARNING, logger="rlpost.loop.checkpoint"):
        path = pick_checkpoint("auto", tmp_path, keep_last=3)
    assert path == manager.step_dir(4)
    assert f"policy/rank0.pt has {size // 2} bytes, {size} were written" in caplog.text
    assert load_driver_state(path)["step"] == 4
    # an explicit path to the damaged one is an error, not a silent substitute
    with pytest.raises(CheckpointError, match="damaged"):
        pick_checkpoint(str(manager.step_dir(6)), tmp_path, keep_last=3)


def test_every_checkpoint_damaged_is_an_error_not_a_fresh_start(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    _save(manager, 1)
    f = manager.step_dir(1) / "driver.json"
    f.write_text(f.read_text().replace('"step": 1', '"step": 7'))  # same size, other bytes
    with pytest.raises(CheckpointError, match=r"step_000001: driver.json changed.*resume=none"):
        pick_checkpoint("auto", tmp_path, keep_last=2)
    assert pick_checkpoint("none", tmp_path, keep_last=2) is None


def test_driver_state_restores_rng_without_pickle(tmp_path):
    random.seed(3)
    torch.manual_seed(3)
    save_driver_state(tmp_path, {"step": 5, "stream": {"epoch": 1}})
    expected = (random.random(), torch.rand(2))
    random.seed(0)
    torch.manual_seed(0)
    state = load_driver_state(tmp_path)
    assert state == {"step": 5, "stream": {"epoch": 1}}
    got = (random.random(), torch.rand(2))
    assert got[0] == expected[0] and torch.equal(got[1], expected[1])


class _Payload:
    """Pickles to a call of os.system: what a hostile checkpoint would carry."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("name", ["driver_rng.pt", "rank0.pt"])
def test_a_checkpoint_file_with_a_pickled_payload_is_refused(tmp_path, name):
    marker = tmp_path / "owned"
    save_driver_state(tmp_path, {"step": 1})
    torch.save({"torch": torch.get_rng_state(), "x": _Payload(marker)}, tmp_path / name)
    with pytest.raises(UnsafeCheckpointError, match=f"{name}: refused to load"):
        if name == "driver_rng.pt":
            load_driver_state(tmp_path)
        else:
            safe_torch_load(tmp_path / name)
    assert not marker.exists()  # the payload never ran


def test_distributed_checkpoint_metadata_with_a_payload_is_refused(tmp_path):
    import pickle

    import torch.distributed.checkpoint as dcp

    from rlpost.export import export
    from rlpost.trainers.files import check_dcp_metadata

    state = tmp_path / "state"
    # a real single-process distributed checkpoint: its metadata passes
    dcp.save({"w": torch.ones(4)}, checkpoint_id=str(state), no_dist=True)
    check_dcp_metadata(state)
    marker = tmp_path / "owned"
    (state / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(
        UnsafeCheckpointError, match=r"\.metadata: refused to load: it names posix.system"
    ):
        check_dcp_metadata(state)
    # python -m rlpost.export refuses it too, before reading anything else
    (tmp_path / "engine.json").write_text("{}")
    with pytest.raises(UnsafeCheckpointError, match="refused to load"):
        export(tmp_path, tmp_path / "out")
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_a_save_failing_in_a_worker_for_want_of_space_is_one_line(tmp_path):
    # What a rank's failed save looks like on the driver: Ray's RayTaskError around
    # torch's CheckpointException, the OSError surviving only as text.
    remote = RuntimeError(
        'ray::TrainerWorker.call() (pid=1)\n  File "filesystem.py", line 520\n'
        "torch.distributed.checkpoint.api.CheckpointException: ranks:dict_keys([0])\n"
        "OSError: [Errno 28] No space left on device"
    )
    manager = CheckpointManager(tmp_path, keep_last=2)
    _save(manager, 1)

    def writer(tmp):
        raise remote

    with pytest.raises(CheckpointError) as info:
        manager.atomic_write(2, writer)
    message = str(info.value)
    assert "\n" not in message and "pid=1" not in message, message
    assert f"step 2 could not be written to {tmp_path / 'checkpoints'}: No space left" in message
    assert "The previous checkpoint (step_000001) is intact" in message
