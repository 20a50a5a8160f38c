"""The launch form: from its fields to the CLI's overrides, the same checks the
CLI runs (``compose``), every problem placed beside the field that caused it,
and the run started as a local process or a Ray job.

Form fields: ``group.<name>`` (a preset, empty for the default), ``key.<dotted
key>`` (a value, empty for the preset's), ``extra`` (more ``key=value`` lines),
``name`` (the run's folder under the runs root), ``target`` (``local`` or
``ray``) and ``address`` (the Ray dashboard, for ``ray``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from rlpost.board import ray_jobs
from rlpost.board.paths import Forbidden, under_root
from rlpost.board.runs import LAUNCH_NAME, LOG_NAME, MARKERS, LaunchRecord, read_launch

GENERAL = "general"  # problems that name no field of the form
RAY_POLL_S = 2.0  # a launched Ray job's status, asked of its cluster at most this often
_TOKEN = re.compile(r"^'?([A-Za-z_][\w.@+~-]*)")


@cache
def key_rows() -> list[tuple[str, str, str]]:
    """(key, type, help) for every schema key, as ``--help-keys`` lists them."""
    from rlpost.config.groups import SCHEMAS
    from rlpost.config.schema import describe

    return [row for name, schema in SCHEMAS.items() for row in describe(schema, name)]


@cache
def default_values() -> dict[str, str]:
    """Each key's value in the default run (what an empty field means)."""
    from rlpost.config.compose import compose, to_dict

    values: dict[str, str] = {}

    def walk(node: object, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        else:
            values[prefix] = json.dumps(node) if not isinstance(node, str) else node

    walk(to_dict(compose([])), "")
    return values


def group_presets() -> dict[str, list[str]]:
    """Each config group's presets along the config search path."""
    from rlpost.config.compose import presets, search_path
    from rlpost.config.groups import GROUPS

    path = search_path()
    return {g: presets(g, path) for g in GROUPS}


def default_name(form: Mapping[str, str]) -> str:
    algo = form.get("group.algo") or "grpo"
    return time.strftime("%Y%m%d-%H%M%S") + f"-{algo}"


@dataclass
class Plan:
    """A checked launch: the overrides, the run directory and the problems by field."""

    overrides: list[str]
    run_dir: Path | None
    problems: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


def form_overrides(form: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(group choices and key overrides from the form, the ``extra`` lines)."""
    out = []
    for k, v in form.items():
        if k.startswith("group.") and v.strip():
            out.append(f"{k.removeprefix('group.')}={v.strip()}")
    for k, v in form.items():
        if k.startswith("key.") and v.strip():
            out.append(f"{k.removeprefix('key.')}={v.strip()}")
    extra = [line.strip() for line in form.get("extra", "").splitlines() if line.strip()]
    return out, extra


def place_problems(
    problems: list[str], form: Mapping[str, str], extra: list[str]
) -> dict[str, list[str]]:
    """Each problem under the form field it names: the group select for a bad
    preset, the key's own field, the extra lines for a key typed there (a typo
    included), else ``GENERAL``."""
    keys = {k for k, _, _ in key_rows()}
    extra_keys = {line.partition("=")[0].lstrip("+~"): line for line in extra}
    groups = {k.removeprefix("group.") for k in form if k.startswith("group.")}
    out: dict[str, list[str]] = {}
    for text in problems:
        m = _TOKEN.match(text)
        token = m.group(1).lstrip("+~") if m else ""
        if text.startswith("'") and any(text.startswith(repr(line)) for line in extra):
            where = "extra"
        elif token in groups and "no such preset" in text:
            where = f"group.{token}"
        elif token == "trainer.run_dir":
            where = "name"
        elif token in extra_keys:
            where = "extra"
        elif token in keys:
            where = f"key.{token}"
        else:
            where = GENERAL
        out.setdefault(where, []).append(text)
    return out


def plan(root: Path, form: Mapping[str, str]) -> Plan:
    """Check the form as ``python -m rlpost.main`` would check the same command."""
    from rlpost.config.compose import compose
    from rlpost.config.schema import ConfigError

    chosen, extra = form_overrides(form)
    problems: dict[str, list[str]] = {}
    name = (form.get("name") or "").strip() or default_name(form)
    run_dir: Path | None = None
    try:
        run_dir = under_root(root, name)
        if run_dir == root.resolve():
            raise Forbidden("name the run's folder")
        if any((run_dir / m).exists() for m in MARKERS):
            problems["name"] = [f"{name}: a run already lives there; choose another name"]
    except Forbidden as exc:
        problems["name"] = [f"{exc}; give a folder name under the runs root"]
    overrides = [*chosen, *extra]
    if run_dir is not None:
        overrides.append(f"trainer.run_dir={run_dir}")
    try:
        compose(overrides)
    except ConfigError as exc:
        for where, texts in place_problems(exc.problems, form, extra).items():
            problems.setdefault(where, []).extend(texts)
    return Plan(overrides, run_dir, problems)


def train_command(overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "rlpost.main", *overrides]


def ray_entrypoint(overrides: list[str]) -> list[str]:
    """The job's command: ``python`` as the cluster's nodes find it (rlpost installed there)."""
    return ["python", "-m", "rlpost.main", *overrides]


def ray_submit_command(overrides: list[str], address: str, job_id: str) -> list[str]:
    """The ``ray job submit`` line equal to the board's submission (``ray_jobs.submit``)."""
    return [
        "ray", "job", "submit", "--address", address, "--submission-id", job_id,
        "--runtime-env-json", json.dumps(ray_jobs.runtime_env()), "--no-wait", "--",
        *ray_entrypoint(overrides),
    ]  # fmt: skip


def job_name(run_dir: Path) -> str:
    """A new Ray submission id for a run: its folder name and the time (a cluster
    keeps every id it was given, so a relaunch under the same name needs a new one)."""
    return f"rlpost-{run_dir.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def shown(command: list[str]) -> str:
    """``command`` as a user would type it: the venv's python as ``python``; a ``ray``
    command in token mode when a Ray token is at hand (``ray start --head`` turns
    token authentication on; examples/ray_job.sh)."""
    parts = ["python" if c == sys.executable else c for c in command]
    if parts[:1] == ["ray"] and ray_jobs.token() is not None:
        return "RAY_AUTH_MODE=token " + shlex.join(parts)
    return shlex.join(parts)


class Launcher:
    """Runs the board started: local processes it owns, Ray jobs by id. What it
    knows of each is also in the run's ``board.json``, so a restarted board still
    finds the command, the pid or job id and, once known, the exit code."""

    def __init__(self) -> None:
        self.procs: dict[Path, subprocess.Popen[bytes]] = {}
        self._ray_seen: dict[Path, tuple[float, tuple[int | None, bool | None]]] = {}

    def start_local(self, run_dir: Path, overrides: list[str]) -> LaunchRecord:
        run_dir.mkdir(parents=True, exist_ok=True)
        command = train_command(overrides)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(run_dir / LOG_NAME, "ab") as log:
            proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env=env,
            )  # fmt: skip
        self.procs[run_dir] = proc
        info: LaunchRecord = {
            "kind": "local",
            "pid": proc.pid,
            "command": command,
            "started": time.time(),
        }
        _write_launch(run_dir, info)
        return info

    def start_ray(
        self, run_dir: Path, overrides: list[str], address: str, job_id: str
    ) -> LaunchRecord:
        """Submit the run as Ray job ``job_id``; ``RayJobError`` (nothing written)
        when the cluster refuses it or cannot be reached."""
        ray_jobs.submit(address, job_id, shlex.join(ray_entrypoint(overrides)))
        run_dir.mkdir(parents=True, exist_ok=True)
        info: LaunchRecord = {
            "kind": "ray", "job_id": job_id, "address": address,
            "command": ray_submit_command(overrides, address, job_id), "started": time.time(),
        }  # fmt: skip
        _write_launch(run_dir, info)
        return info

    def state(self, run_dir: Path) -> tuple[int | None, bool | None]:
        """(exit code, alive) of a run the board launched; (None, None) for others."""
        proc = self.procs.get(run_dir)
        if proc is not None:
            code = proc.poll()
            if code is None:
                return None, True
            info = read_launch(run_dir)
            if info.get("exit_code") != code:
                _write_launch(run_dir, {**info, "exit_code": code})
            return code, False
        info = read_launch(run_dir)
        if not info:
            return None, None
        if "exit_code" in info:
            return int(info["exit_code"]), False
        if info.get("kind") == "local":
            return None, _pid_runs_rlpost(int(info.get("pid", 0)))
        if info.get("kind") == "ray":
            return self._ray_state(run_dir, info)
        return None, None

    def _ray_state(self, run_dir: Path, info: LaunchRecord) -> tuple[int | None, bool | None]:
        """Asked of the cluster at most every ``RAY_POLL_S``; once the job ended, its
        whole log is copied to ``board.log`` (the error line of a failed run). A
        cluster that does not answer leaves the status to the run's files: (None, None)."""
        asked, state = self._ray_seen.get(run_dir, (0.0, (None, True)))
        if time.time() - asked < RAY_POLL_S:
            return state
        address, job = info["address"], info["job_id"]
        try:
            code = ray_jobs.exit_code(ray_jobs.info(address, job))
            if code is not None:
                (run_dir / LOG_NAME).write_text(ray_jobs.logs(address, job))
        except ray_jobs.RayJobError:
            state = (None, None)
        else:
            if code is not None:
                _write_launch(run_dir, {**info, "exit_code": code})
            state = (code, code is None)
        self._ray_seen[run_dir] = (time.time(), state)
        return state

    def refresh_log(self, run_dir: Path) -> None:
        """Copy a running Ray job's log from the cluster to ``board.log`` (what the run
        page shows). A cluster that does not answer leaves the last copy: the
        run's status says so."""
        info = read_launch(run_dir)
        if info.get("kind") != "ray" or "exit_code" in info:
            return
        try:
            text = ray_jobs.logs(info["address"], info["job_id"])
        except ray_jobs.RayJobError:
            return
        (run_dir / LOG_NAME).write_text(text)

    def stop(self, run_dir: Path) -> str:
        """Ask a launched run to stop: SIGINT to a local process (it checkpoints at
        the next step, as Ctrl-C does); for a Ray job, Ray's stop, which sends it
        SIGTERM (the same checkpoint) and waits ``ray_jobs.STOP_WAIT_S`` for it."""
        info = read_launch(run_dir)
        proc = self.procs.get(run_dir)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            return f"sent SIGINT to process {proc.pid}: it stops after the current step"
        if info.get("kind") == "local" and _pid_runs_rlpost(int(info.get("pid", 0))):
            os.kill(int(info["pid"]), signal.SIGINT)
            return f"sent SIGINT to process {info['pid']}: it stops after the current step"
        if info.get("kind") == "ray" and "exit_code" not in info:
            job = info["job_id"]
            try:
                stopped = ray_jobs.stop(info["address"], job)
            except ray_jobs.RayJobError as exc:
                return f"could not stop Ray job {job}: {exc}"
            self._ray_seen.pop(run_dir, None)  # the next look asks the cluster again
            if not stopped:
                return f"Ray job {job} was not running"
            return (
                f"asked Ray to stop job {job}: Ray sends it SIGTERM, it stops after the current "
                f"step with a checkpoint (SIGKILL only after {ray_jobs.STOP_WAIT_S} s)"
            )
        return "not running"


def record_shown(run_dir: Path, info: LaunchRecord, command: str) -> None:
    """Keep the command line the user could have typed next to the launch record."""
    _write_launch(run_dir, {**info, "shown": command})


def _write_launch(run_dir: Path, info: LaunchRecord) -> None:
    tmp = run_dir / f"{LAUNCH_NAME}.tmp"
    tmp.write_text(json.dumps(info, indent=1))
    os.replace(tmp, run_dir / LAUNCH_NAME)


def _pid_runs_rlpost(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"rlpost.main" in cmdline
