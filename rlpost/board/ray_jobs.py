"""Ray jobs through the cluster's Jobs REST API, the one ``ray job submit``,
``status``, ``logs`` and ``stop`` call: one HTTP request each instead of a
``ray`` process (about 1.5 s of CPU to start) every few seconds per run.

Token authentication as Ray's own clients do it: the token in
``RAY_AUTH_TOKEN``, else in the file ``RAY_AUTH_TOKEN_PATH`` names, else in
``~/.ray/auth_token`` (``ray start --head`` writes it there), sent as
``Authorization: Bearer``; a cluster without token authentication ignores it.

``ray job stop`` sends the job's driver (and its child processes) SIGTERM and,
``RAY_JOB_STOP_WAIT_TIME_S`` later (3 s by default), SIGKILL: shorter than a
training step and its checkpoint. The board submits with that wait raised to
``STOP_WAIT_S`` in the job's environment (the job supervisor reads it there).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

STOP_WAIT_S = 600  # SIGTERM -> SIGKILL: the step in progress ends, checkpoints, the run exits
STOPPED_EXIT = 143  # 128 + SIGTERM: what `ray job stop` sends (Ray reports no exit code)
ALIVE = ("PENDING", "RUNNING")


class RayJobError(RuntimeError):
    """The Jobs API refused a request or could not be reached; says what to check."""


def runtime_env() -> dict[str, dict[str, str]]:
    """The job's runtime environment: a stop lets the current step end and checkpoint."""
    return {"env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": str(STOP_WAIT_S)}}


def token() -> str | None:
    """The Ray token this process would send, looked up in Ray's order."""
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return os.environ["RAY_AUTH_TOKEN"].strip()
    named = os.environ.get("RAY_AUTH_TOKEN_PATH")
    for path in ([Path(named)] if named else []) + [Path.home() / ".ray" / "auth_token"]:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text:
            return text
    return None


def base_url(address: str) -> str:
    """The dashboard's URL (``http://`` added to a bare ``host:port``)."""
    address = address.strip().rstrip("/")
    return address if "://" in address else f"http://{address}"


def _request(
    address: str, method: str, path: str, body: object = None, timeout: float = 30
) -> object:
    """``body`` as JSON to the Jobs API; its JSON answer."""
    url = base_url(address) + path
    headers = {"Content-Type": "application/json"}
    secret = token()
    if secret:
        headers["Authorization"] = f"Bearer {secret}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        text = exc.read().decode(errors="replace").strip()[:2000]
        if exc.code == 401:
            raise RayJobError(
                f"the Ray cluster at {address} uses token authentication and this board has "
                "no token: start the board where ~/.ray/auth_token holds the cluster's token "
                "(ray start --head writes it), or set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"
            ) from exc
        if exc.code == 403:
            raise RayJobError(
                f"the Ray cluster at {address} refused this board's token (RAY_AUTH_TOKEN, "
                "RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token): use the head node's token"
            ) from exc
        raise RayJobError(f"{method} {url}: HTTP {exc.code}: {text}") from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise RayJobError(
            f"cannot reach the Ray dashboard at {address} ({reason}): give the address "
            "`ray start --head` printed for the dashboard (default port 8265), and "
            "check the cluster is up"
        ) from exc


def _job_path(job_id: str, tail: str = "") -> str:
    return f"/api/jobs/{urllib.parse.quote(job_id, safe='')}{tail}"


def submit(address: str, job_id: str, entrypoint: str) -> None:
    """``ray job submit --submission-id job_id --no-wait`` of ``entrypoint`` (a
    shell command line, as the CLI builds it with ``shlex.join``)."""
    body = {"entrypoint": entrypoint, "submission_id": job_id, "runtime_env": runtime_env()}
    _request(address, "POST", "/api/jobs/", body)


def info(address: str, job_id: str) -> dict[str, object]:
    """The job's details: ``status`` (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED),
    ``message``, ``driver_exit_code`` (when the driver exited by itself)."""
    out = _request(address, "GET", _job_path(job_id), timeout=10)
    if not isinstance(out, dict) or "status" not in out:
        raise RayJobError(f"job {job_id} at {address}: unexpected answer {str(out)[:200]}")
    return out


def logs(address: str, job_id: str) -> str:
    """The driver's output so far."""
    out = _request(address, "GET", _job_path(job_id, "/logs"), timeout=10)
    return str(out.get("logs", "")) if isinstance(out, dict) else ""


def stop(address: str, job_id: str) -> bool:
    """Ask Ray to stop the job (SIGTERM now, SIGKILL ``STOP_WAIT_S`` later); False
    when it was no longer running."""
    out = _request(address, "POST", _job_path(job_id, "/stop"))
    return bool(out.get("stopped")) if isinstance(out, dict) else False


def exit_code(details: dict[str, object]) -> int | None:
    """The run's exit code as the board counts it, None while the job is alive: the
    driver's own when it exited by itself, ``STOPPED_EXIT`` for a stopped job, 1
    for a job that failed before its driver ran (its runtime environment, say)."""
    status = str(details.get("status", "")).upper()
    if status in ALIVE:
        return None
    code = details.get("driver_exit_code")
    if status == "STOPPED":
        return STOPPED_EXIT
    if isinstance(code, int):
        return code
    return 0 if status == "SUCCEEDED" else 1
