"""Checkpoints: exact resume and crash safety.

A run of 2k steps and a run of k steps, saved, then resumed in a new process
for k more steps end with bit-identical parameters and identical metrics at
step 2k. A save that fails or is killed half-way leaves the previous
checkpoint as the latest complete one, and it still loads.

Through the real CLI: a save onto a full disk stops the run with an error
naming the path and the intact previous checkpoint, which the same command
resumes from once there is room; a truncated file in the newest checkpoint
makes ``trainer.resume=auto`` fall back to the one before it with a warning.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from engine_utils import DEVICES, advantages, engine, free_port, make_batch, spawn

from rlpost.algos import PolicyLossConfig
from rlpost.loop.checkpoint import CheckpointManager, load_driver_state, save_driver_state
from rlpost.models.tiny import build_tiny_model
from rlpost.trainers.fsdp.lora import LoraSettings

K = 2
VARIANTS = {
    "full": {},
    # dropout draws from the RNG, so an RNG state not restored would show
    "lora": {"lora": LoraSettings(rank=4, alpha=8.0, dropout=0.1)},
}


def _engine(model_dir: str, rank: int, port: int, variant: str, device: str = "cpu"):
    # warm-up of 3 steps: the LR schedule's position must survive the resume
    if device != "cpu":
        # bit-identical runs on a GPU: the deterministic kernels (the embedding's
        # backward, cuBLAS's workspace), as a user comparing two runs would set
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        torch.use_deterministic_algorithms(True, warn_only=True)
    return engine(
        model_dir, rank, 1, port, device, lr=1e-2, lr_warmup_steps=3, micro_batch_size=3,
        **VARIANTS[variant],
    )  # fmt: skip


def _train(eng, first: int, steps: int) -> list[dict]:
    history = []
    for step in range(first, first + steps):
        batch = make_batch(seed=step)
        batch.advantages_bt = advantages(batch, seed=step)
        batch.old_logp_bt = eng.logprobs(batch)
        history.append(eng.update_policy(batch, PolicyLossConfig()))
    return history


def _numbers(metrics: dict) -> dict:
    """Metrics without wall-clock timings."""
    return {k: v for k, v in metrics.items() if not k.startswith("timing/")}


def _params(eng) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in eng.named_weights()}


def _resume_worker(
    rank: int,
    model_dir: str,
    port: int,
    variant: str,
    mode: str,
    run_dir: str,
    out: str,
    device: str,
) -> None:
    """mode: 'straight' trains 2K steps; 'save' trains K and checkpoints; 'resume'
    loads the latest checkpoint and trains K more."""
    eng = _engine(model_dir, rank, port, variant, device)
    manager = CheckpointManager(run_dir, keep_last=2)
    first = 0
    if mode == "resume":
        latest = manager.latest()
        assert latest is not None
        eng.load_checkpoint(str(latest / "policy"))
        first = load_driver_state(latest)["step"]
    history = _train(eng, first, 2 * K if mode == "straight" else K)
    if mode == "save":

        def writer(tmp: Path) -> None:
            eng.save_checkpoint(str(tmp / "policy"))
            save_driver_state(tmp, {"step": K})

        manager.atomic_write(K, writer)
    torch.save({"history": history, "params": _params(eng)}, out)
    eng.close()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(build_tiny_model("micro", tmp_path_factory.mktemp("ckpt") / "m", seed=0))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_resume_is_exact(variant, device, model_dir, tmp_path):
    run_dir = tmp_path / "run"
    results = {}
    for mode in ("straight", "save", "resume"):
        out = tmp_path / f"{mode}.pt"
        args = (model_dir, free_port(), variant, mode, str(run_dir), str(out), device)
        spawn(_resume_worker, args)
        results[mode] = torch.load(out, weights_only=False)
    straight, resumed = results["straight"], results["resume"]
    assert straight["params"].keys() == resumed["params"].keys()
    for name, w in straight["params"].items():
        assert torch.equal(resumed["params"][name], w), name
    # the metrics of the resumed run's last step are those of step 2K
    assert _numbers(resumed["history"][-1]) == _numbers(straight["history"][-1])
    assert [_numbers(m) for m in results["save"]["history"]] == [
        _numbers(m) for m in straight["history"][:K]
    ]
    # the schedule was restored mid warm-up: lr at step 2K-1 is lr * 4/4, not 2/4
    assert resumed["history"][-1]["actor/lr"] == pytest.approx(1e-2)
    # training moved the weights after the resume (the comparison is not vacuous)
    saved = results["save"]["params"]
    assert any(not torch.equal(saved[n], w) for n, w in straight["params"].items())


def _crash_worker(rank: int, model_dir: str, port: int, run_dir: str, out: str) -> None:
    """Checkpoint step 1; a failing save of step 2; a save of step 3 killed half-way."""
    eng = _engine(model_dir, rank, port, "full")
    manager = CheckpointManager(run_dir, keep_last=2)
    _train(eng, 0, 1)
    manager.atomic_write(1, lambda tmp: eng.save_checkpoint(str(tmp / "policy")))
    torch.save(_params(eng), out)
    _train(eng, 1, 1)

    def failing(tmp: Path) -> None:
        eng.save_checkpoint(str(tmp / "policy"))
        raise OSError("disk full")

    from rlpost.loop.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match="step 2 could not be written.*OSError: disk full"):
        manager.atomic_write(2, failing)

    def killed(tmp: Path) -> None:
        eng.save_checkpoint(str(tmp / "policy"))
        os.kill(os.getpid(), signal.SIGKILL)

    manager.atomic_write(3, killed)


def _load_worker(rank: int, model_dir: str, port: int, path: str, out: str) -> None:
    eng = _engine(model_dir, rank, port, "full")
    eng.load_checkpoint(path)
    torch.save(_params(eng), out)
    eng.close()


def test_a_failed_or_killed_save_leaves_the_previous_checkpoint(model_dir, tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(mp.ProcessExitedException, match="SIGKILL"):
        spawn(_crash_worker, (model_dir, free_port(), str(run_dir), str(tmp_path / "s1.pt")))
    manager = CheckpointManager(run_dir, keep_last=2)
    ckpts = run_dir / "checkpoints"
    # the killed save left its temporary directory; the failed one cleaned up
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_000001", "step_000003.partial"]
    assert manager.latest() == manager.step_dir(1)
    out = tmp_path / "loaded.pt"
    spawn(_load_worker, (model_dir, free_port(), str(manager.latest() / "policy"), str(out)))
    loaded, saved = torch.load(out), torch.load(tmp_path / "s1.pt")
    for name, w in saved.items():
        assert torch.equal(loaded[name], w), name
    # the next successful save clears the leftovers
    manager.atomic_write(4, lambda tmp: (tmp / "x").write_text("x"))
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_000001", "step_000004"]


def test_keep_last_prunes_oldest(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    for step in (5, 10, 15):
        manager.atomic_write(step, lambda tmp: (tmp / "x").write_text("x"))
    assert [s for s, _ in manager.complete()] == [10, 15]
    assert manager.latest() == manager.step_dir(15)


def test_a_passthrough_error_is_reraised_as_it_is_and_the_partial_save_removed(tmp_path):
    """A rank that dies mid-save is the caller's to recover from, not a disk fault."""
    from rlpost.loop.checkpoint import CheckpointError

    class RankDied(RuntimeError):
        pass

    def dies(tmp: Path) -> None:
        (tmp / "half").write_text("x")
        raise RankDied("the actor is dead")

    manager = CheckpointManager(tmp_path, keep_last=2)
    manager.atomic_write(1, lambda tmp: (tmp / "x").write_text("x"))
    with pytest.raises(RankDied):
        manager.atomic_write(2, dies, passthrough=(RankDied,))
    with pytest.raises(CheckpointError, match="step 2 could not be written"):
        manager.atomic_write(2, dies)  # without passthrough it names the disk advice
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000001"]


def _disk_full_worker(rank: int, model_dir: str, port: int, run_dir: str, out: str, fsize: int):
    """Checkpoint step 1, then step 2 onto a disk with room for one checkpoint only."""
    from rlpost.loop.checkpoint import CheckpointError

    eng = _engine(model_dir, rank, port, "full")
    manager = CheckpointManager(run_dir, keep_last=2)
    _train(eng, 0, 1)

    def writer(tmp: Path) -> None:
        eng.save_checkpoint(str(tmp / "policy"))
        save_driver_state(tmp, {"step": 1})

    manager.atomic_write(1, writer)
    torch.save(_params(eng), out)
    _train(eng, 1, 1)
    if fsize:  # no tmpfs here: a file-size limit on this writer instead
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    with pytest.raises(CheckpointError) as info:
        manager.atomic_write(2, writer)
    message = str(info.value)
    assert "checkpoint of step 2 could not be written" in message, message
    assert "(step_000001) is intact" in message and "trainer.run_dir" in message
    assert "disk is full" in message or "No space left" in message
    eng.close()


def test_disk_full_during_save_is_a_clear_error_and_the_previous_checkpoint_loads(
    model_dir, tmp_path
):
    import subprocess

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # A real full disk: a 2 MiB tmpfs holds one checkpoint of the micro model (~1.25 MB)
    # and not two. Where mounting is not allowed, RLIMIT_FSIZE on the writer.
    mounted = (
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(run_dir)]).returncode
        == 0
    )
    try:
        out = tmp_path / "s1.pt"
        fsize = 0 if mounted else 256 * 1024
        spawn(_disk_full_worker, (model_dir, free_port(), str(run_dir), str(out), fsize))
        manager = CheckpointManager(run_dir, keep_last=2)
        assert [s for s, _ in manager.complete()] == [1]
        assert not any(p.name.endswith(".partial") for p in (run_dir / "checkpoints").iterdir())
        loaded_out = tmp_path / "loaded.pt"
        spawn(
            _load_worker,
            (model_dir, free_port(), str(manager.latest() / "policy"), str(loaded_out)),
        )
        loaded, saved = torch.load(loaded_out), torch.load(out)
        for name, w in saved.items():
            assert torch.equal(loaded[name], w), name
    finally:
        if mounted:
            subprocess.run(["umount", str(run_dir)])


def _cli(model: str, run_dir: Path, steps: int, *extra: str):
    from cli_utils import cli, cli_args

    return cli(cli_args(Path(model), run_dir, steps, *extra))


def _limit_writer(proc, run_dir: Path, fsize: int) -> None:
    """RLIMIT_FSIZE on the trainer rank (the checkpoint's writer) once step 2's
    checkpoint is complete; Python ignores SIGXFSZ, so a write past it is EFBIG."""
    import psutil
    from cli_utils import actor_pids, wait_until

    wait_until((run_dir / "checkpoints/step_000002/COMPLETE").exists, proc, run_dir)
    [pid] = actor_pids(proc.pid, "TrainerWorker")
    psutil.Process(pid).rlimit(psutil.RLIMIT_FSIZE, (fsize, fsize))


# A full disk during a save is checked on the engine by default (above); through
# the CLI and its rerun with -m extended.
@pytest.mark.extended
def test_disk_full_through_the_cli_is_a_clear_error_and_the_same_command_resumes(
    model_dir, tmp_path
):
    import re
    import subprocess
    import time

    from cli_utils import metrics, output, start

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # A 2 MiB tmpfs holds the run's small files and one checkpoint of the micro
    # model (1.3 MB), not two. Where mounting is not allowed: RLIMIT_FSIZE on the
    # trainer rank once the first checkpoint is written.
    mount = ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(run_dir)]
    mounted = subprocess.run(mount, capture_output=True).returncode == 0
    mechanism = "a 2 MiB tmpfs" if mounted else "RLIMIT_FSIZE=256 KiB on the trainer rank"
    try:
        proc = start(Path(model_dir), run_dir, 1000)  # checkpoints every 2 steps
        try:
            if not mounted:
                _limit_writer(proc, run_dir, 256 * 1024)
            code = proc.wait(timeout=300)
        finally:
            proc.kill()
        text = output(run_dir)
        assert code == 2, text[-3000:]
        [line] = [x for x in text.splitlines() if x.startswith("error: checkpoint")]
        failed = re.match(r"error: checkpoint of step (\d+) could not be written to (\S+):", line)
        assert failed and failed.group(2) == str(run_dir / "checkpoints"), line
        # torch reports a write cut short by RLIMIT_FSIZE as "unexpected pos", not EFBIG
        reasons = ("No space left on device", "File too large", "a file-size limit was hit")
        assert any(r in line for r in reasons), line
        intact = re.search(r"The previous checkpoint \(step_(\d+)\) is intact", line)
        assert intact, line
        kept, lost = int(intact.group(1)), int(failed.group(1)) - int(intact.group(1))
        assert kept >= 2 and lost == 2  # the save after it failed
        assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [f"step_{kept:06d}"]

        # Room again, the same command with resume=auto (the default).
        if mounted:
            remount = ["mount", "-o", "remount,size=16m", str(run_dir)]
            subprocess.run(remount, check=True)
        started = time.perf_counter()
        done = _cli(model_dir, run_dir, kept + 1)
        back_s = time.perf_counter() - started
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"step_{kept:06d} (step {kept})" in done.stderr, done.stderr[-3000:]
        assert [r["step"] for r in metrics(run_dir)] == list(range(kept + 2))
    finally:
        if mounted:
            subprocess.run(["umount", str(run_dir)])
    print(f"disk full ({mechanism}) during the save of step {kept + lost}: exit 2 naming "
          f"{run_dir / 'checkpoints'} and step_{kept:06d} as intact; {lost} step(s) lost; "
          f"after freeing space the same command resumed from step {kept} and finished in "
          f"{back_s:.1f}s")  # fmt: skip


def test_truncated_newest_checkpoint_through_the_cli_falls_back_to_the_previous(
    micro_model, straight_dir, tmp_path
):
    import shutil
    import time

    from cli_utils import comparable, metrics

    from rlpost.loop.trace_file import read_trace

    # a copy of the session's 4-step run (checkpoints of steps 2 and 4), continued
    run_dir = tmp_path / "run"
    shutil.copytree(straight_dir, run_dir)
    first = metrics(run_dir)
    newest = run_dir / "checkpoints/step_000004/policy/state/__0_0.distcp"
    size = newest.stat().st_size
    with open(newest, "r+b") as f:  # as a disk filling up or a copy cut short leaves it
        f.truncate(size // 2)

    started = time.perf_counter()
    rerun = _cli(str(micro_model), run_dir, 5)
    rerun_s = time.perf_counter() - started
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    err = rerun.stderr
    assert (
        f"checkpoint {run_dir.resolve()}/checkpoints/step_000004 is damaged "
        f"(policy/state/__0_0.distcp has {size // 2} bytes, {size} were written); "
        "falling back to the one before it"
    ) in err, err[-3000:]
    assert "resuming from step_000002 instead" in err
    assert "step_000002 (step 2)" in err
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5]
    for a, b in zip(first[3:5], rows[3:5]):  # steps 3 and 4 redone exactly from step 2
        assert comparable(a) == comparable(b), a["step"]
    # The timeline holds each step once: steps 3 and 4 of the first run were cut.
    steps = [e["args"]["step"] for e in read_trace(run_dir / "trace.json") if e["name"] == "step"]
    assert steps == [1, 2, 3, 4, 5]
    print(f"newest checkpoint (step 4) truncated to {size // 2} of {size} bytes: resume=auto "
          f"warned, fell back to step 2 and redid 2 steps; the rerun took {rerun_s:.1f}s")  # fmt: skip
