"""The CLI's ``rlpost.main.main`` run in the test process, as ``python -m
rlpost.main`` runs it, for the tests about what a run does rather than about the
process that runs it.

Of a 2-step CLI run's half minute, about 8 s are the driver's imports and 5 s
starting and stopping its local Ray. Here the imports happen once per test
session, and consecutive runs share one local Ray, started as the CLI starts its
own (``rlpost.workers.placement.connect``): a run finds it running and leaves it
so, as a notebook's run does. The shared Ray is stopped after a run that failed
(exit code 1 or a signal's: whatever it left behind goes with it), before a run that
asks for other environment variables (Ray's workers take the environment Ray
started with), and at the end of each test module (``stop_ray``, from
``tests/conftest.py``), so that a module starting its own Ray finds none.

A test about the process itself -- signals, what is left running, a Ray job, the
exit of the interpreter -- runs the command (``subprocess``) instead.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

# The environment of every run, as the tests' commands set it.
BASE_ENV = {"TQDM_DISABLE": "1"}


@dataclass
class Finished:
    """What ``subprocess.run(..., capture_output=True, text=True)`` would hold."""

    returncode: int
    stdout: str
    stderr: str


# The environment variables the shared Ray started with (None: no shared Ray).
_ray_env: tuple[tuple[str, str | None], ...] | None = None


def stop_ray() -> None:
    """Stop the shared Ray if a run here started it."""
    global _ray_env
    if _ray_env is None:
        return
    import ray

    from rlpost.workers.placement import disconnect

    _ray_env = None
    if ray.is_initialized():
        disconnect()


def _start_ray(env: tuple[tuple[str, str | None], ...]) -> None:
    """A local Ray as ``connect`` starts the CLI's, sized for any test's run."""
    global _ray_env
    import ray

    if _ray_env == env and ray.is_initialized():
        return
    stop_ray()
    if ray.is_initialized():
        raise RuntimeError("a test left its own Ray running; in-process CLI runs start their own")
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(
        logging.ERROR
    )
    ray.init(
        address="local", num_cpus=max(os.cpu_count() or 1, 16), include_dashboard=False,
        log_to_driver=True, logging_level=logging.WARNING,
        _system_config={"prestart_worker_first_driver": False},
    )  # fmt: skip
    _ray_env = env


@contextlib.contextmanager
def _environment(env: Mapping[str, str | None], cwd: Path | str | None) -> Iterator[None]:
    """``env`` set (None: unset) and ``cwd`` current for the block, then as before."""
    before = {k: os.environ.get(k) for k in env}
    here = os.getcwd()
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    if cwd is not None:
        os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(here)
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _captured() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """stdout and stderr of the block, the CLI's log lines on stderr as its
    ``logging.basicConfig`` writes them, and the lines Ray forwards from workers."""
    out, err = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    level, handlers = root.level, list(root.handlers)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield out, err
    finally:
        root.handlers = handlers  # with any ``basicConfig`` added, which wrote to ``err``
        root.setLevel(level)


def main_in_process(
    argv: list[str],
    env: Mapping[str, str | None] | None = None,
    cwd: Path | str | None = None,
    module: str = "rlpost.main",
) -> Finished:
    """``python -m <module> *argv`` (``rlpost.main`` or ``rlpost.eval``) with ``env``
    added to the environment (None removes a variable) and ``cwd`` the working
    directory, run by this process."""
    main = importlib.import_module(module).main

    env = {**BASE_ENV, **(env or {})}
    key = tuple(sorted(env.items()))
    code = 1
    with _environment(env, cwd):
        _start_ray(key)
        with _captured() as (out, err):
            try:
                code = main(list(argv))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:  # what the interpreter would print before exiting 1
                traceback.print_exc()
    if code not in (0, 2):  # 2: a config error, stopped before the run started anything
        stop_ray()
    return Finished(code, out.getvalue(), err.getvalue())
