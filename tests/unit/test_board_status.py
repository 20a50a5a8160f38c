"""A run's status on the runs page, from what its directory holds."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from rlpost.board.runs import describe_run, detect_status, headline, last_error, read_metrics

OLD = time.time() - 3600  # an hour ago: not "recently modified"


def _run(path: Path, steps: list[int], total: int, age: float = 3600.0) -> Path:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(
        f"algo: {{name: dapo}}\nmodel: {{path: null, preset: tiny}}\n"
        f"data: {{name: arith, train_files: []}}\ntrainer: {{total_steps: {total}}}\n"
    )
    rows = [{"step": s, "reward/mean": s / 10, "val/accuracy": 0.3 + s / 100} for s in steps]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    stamp = time.time() - age
    os.utime(path / "metrics.jsonl", (stamp, stamp))
    return path


def _checkpoint(run: Path, step: int) -> None:
    """A complete checkpoint, as rlpost/loop/checkpoint.py publishes one."""
    path = run / "checkpoints" / f"step_{step:06d}"
    path.mkdir(parents=True)
    (path / "COMPLETE").write_text(str(step))


def test_finished_by_final_dir_or_by_reaching_total_steps(tmp_path: Path):
    run = _run(tmp_path / "a", [0, 1, 2], total=5)
    (run / "final").mkdir()
    assert detect_status(run, read_metrics(run), 5) == ("finished", None)
    run = _run(tmp_path / "b", [0, 1, 2], total=2)  # save_final=false: no final/
    assert detect_status(run, read_metrics(run), 2) == ("finished", None)


def test_running_while_metrics_are_fresh_stopped_with_a_checkpoint(tmp_path: Path):
    run = _run(tmp_path / "a", [0, 1], total=5, age=5.0)
    assert detect_status(run, read_metrics(run), 5)[0] == "running"
    # The board knows its own process ended: fresh metrics do not make it running.
    assert detect_status(run, read_metrics(run), 5, alive=False)[0] != "running"
    run = _run(tmp_path / "b", [0, 1], total=5)
    (run / "checkpoints" / "step_000002.partial").mkdir(parents=True)  # a save cut short
    assert detect_status(run, read_metrics(run), 5) == ("unknown", None)
    _checkpoint(run, 1)
    assert detect_status(run, read_metrics(run), 5) == ("stopped", None)
    assert describe_run(tmp_path, run).checkpoint == (1, "checkpoints/step_000001")
    run = _run(tmp_path / "c", [0, 1], total=5)
    assert detect_status(run, read_metrics(run), 5) == ("unknown", None)


def test_failed_with_the_last_error_line_of_the_boards_log(tmp_path: Path):
    run = _run(tmp_path / "a", [0], total=5)
    (run / "board.log").write_text(
        "INFO rlpost: starting\nTraceback (most recent call last):\n"
        '  File "x.py", line 1\nValueError: first\nerror: invalid config:\n  trainer.x: bad\n'
    )
    # "error: invalid config:" is the CLI's line; "  trainer.x: bad" has a space in its head
    assert detect_status(run, read_metrics(run), 5) == ("failed", "error: invalid config:")
    (run / "board.log").write_text("step 1\nRuntimeError: CUDA out of memory\n")
    assert last_error(run / "board.log") == "RuntimeError: CUDA out of memory"


def test_a_launched_process_decides_by_its_exit_code(tmp_path: Path):
    run = _run(tmp_path / "a", [0, 1], total=5)
    rows = read_metrics(run)
    assert detect_status(run, rows, 5, alive=True) == ("running", None)
    assert detect_status(run, rows, 5, exit_code=0) == ("finished", None)
    assert detect_status(run, rows, 5, exit_code=130) == ("stopped", None)  # SIGINT, checkpointed
    assert detect_status(run, rows, 5, exit_code=2) == ("failed", "exit code 2")


def test_metrics_keep_the_last_row_of_a_redone_step_and_skip_a_half_line(tmp_path: Path):
    run = _run(tmp_path / "a", [0, 1, 2], total=3)
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 2, "reward/mean": 0.9}) + "\n")  # a resumed run redid step 2
        f.write('{"step": 3, "reward/me')  # being written
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[-1]["reward/mean"] == 0.9
    # first and last val/accuracy: 0.3 + 0/100 -> 0.3 + 1/100 (step 2's new row has none)
    assert headline(rows) == ("val/accuracy", 0.3, 0.31)


def test_describe_reads_algo_model_data_and_step(tmp_path: Path):
    run = describe_run(tmp_path, _run(tmp_path / "sweep" / "a", [0, 1, 2], total=2))
    assert (run.rel, run.algo, run.model, run.data) == ("sweep/a", "dapo", "tiny", "arith")
    assert (run.step, run.total_steps, run.status) == (2, 2, "finished")


def test_a_launch_record_tells_a_restarted_board_how_a_run_ended(tmp_path: Path):
    from rlpost.board.launch import Launcher

    run = _run(tmp_path / "a", [0, 1], total=5, age=5.0)  # fresh metrics
    launcher = Launcher()  # a new board: it did not start this process itself
    assert launcher.state(run) == (None, None)  # no record: decided from the files
    (run / "board.json").write_text(json.dumps({"kind": "local", "pid": 2**22 + 1}))
    assert launcher.state(run) == (None, False)  # that pid runs no rlpost: not running
    assert detect_status(run, read_metrics(run), 5, *launcher.state(run))[0] == "unknown"
    assert launcher.stop(run) == "not running"
    (run / "board.json").write_text(json.dumps({"kind": "local", "pid": 1, "exit_code": 130}))
    assert detect_status(run, read_metrics(run), 5, *launcher.state(run)) == ("stopped", None)
