"""The board's aiohttp application: pages, JSON for live refresh, the launch
form, and the checks every request passes (token, host, CSRF, paths)."""

from __future__ import annotations

import asyncio
import hmac
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from rlpost.board import launch as launching
from rlpost.board import ray_jobs
from rlpost.board.charts import chart_data
from rlpost.board.html import esc, page, url
from rlpost.board.launch_page import launch_page
from rlpost.board.pages import run_page, runs_page
from rlpost.board.paths import Forbidden, under_root
from rlpost.board.runs import LOG_NAME, MARKERS, Run, describe_run, find_runs, read_metrics
from rlpost.board.samples import KINDS, dump_steps, keep, read_dump
from rlpost.board.samples_page import samples_page
from rlpost.board.timeline_page import timeline_page
from rlpost.loop.trace_file import read_trace

if TYPE_CHECKING:
    from aiohttp.typedefs import Handler

STATIC = Path(__file__).parent  # board.js, board.css (package data)
STATIC_FILES = {"board.js": "text/javascript", "board.css": "text/css"}
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
COOKIE = "rlpost_board_token"
LOG_TAIL_BYTES = 32768
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


@dataclass
class Board:
    """What the handlers share: the runs root and the launch switches."""

    root: Path
    token: str | None = None  # required on every request when set (a non-local --host)
    allow_launch: bool = False
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    launcher: launching.Launcher = field(default_factory=launching.Launcher)


BOARD = web.AppKey("board", Board)


def _board(request: web.Request) -> Board:
    return request.app[BOARD]


def _same(given: str, secret: str) -> bool:
    """Constant-time comparison (bytes: any text a request carries compares)."""
    return hmac.compare_digest(given.encode(), secret.encode())


def _token_ok(board: Board, request: web.Request) -> tuple[bool, bool]:
    """(the request carries the token, it came in the query string)."""
    assert board.token is not None
    given = request.query.get("token")
    if given is not None and _same(given, board.token):
        return True, True
    header = request.headers.get("X-Board-Token") or request.headers.get(
        "Authorization", ""
    ).removeprefix("Bearer ")
    for candidate in (header, request.cookies.get(COOKIE, "")):
        if candidate and _same(candidate, board.token):
            return True, False
    return False, False


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    board = _board(request)
    if board.token is not None:
        ok, in_query = _token_ok(board, request)
        if not ok:
            raise web.HTTPForbidden(
                text="a token is required: open the URL the board printed at start "
                "(?token=...), or send it as the X-Board-Token header"
            )
        if in_query:  # keep it in a cookie, out of the address bar and history
            query = {k: v for k, v in request.query.items() if k != "token"}
            target = request.rel_url.with_query(query)
            found = web.HTTPFound(str(target))
            found.set_cookie(COOKIE, board.token, httponly=True, samesite="Strict")
            raise found
    elif (request.url.host or "") not in LOCAL_HOSTS:
        # Bound to localhost: refuse another Host (a DNS-rebinding page).
        raise web.HTTPForbidden(text="this board answers on localhost only")
    if request.method == "POST":
        form = await request.post()
        if not _same(str(form.get("csrf", "")), board.csrf):
            raise web.HTTPForbidden(text="form expired or from another site: reload the page")
    try:
        response = await handler(request)
    except Forbidden as exc:
        raise web.HTTPForbidden(text=str(exc)) from exc
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, content_type="text/html", status=status)


def _run_dir(board: Board, rel: str) -> Path:
    path = under_root(board.root, rel)
    if not any((path / m).is_file() for m in MARKERS):
        raise web.HTTPNotFound(text=f"{rel!r}: no run directory there")
    return path


async def _describe(board: Board, run_dir: Path) -> Run:
    code, alive = await asyncio.to_thread(board.launcher.state, run_dir)
    return describe_run(board.root, run_dir, code, alive)


async def runs_view(request: web.Request) -> web.Response:
    board = _board(request)
    runs = [await _describe(board, p) for p in find_runs(board.root)]
    return _html(runs_page(runs, str(board.root)))


async def run_view(request: web.Request) -> web.Response:
    board = _board(request)
    names = request.query.getall("run", [])
    if not names:
        raise web.HTTPFound("/")
    runs = [await _describe(board, _run_dir(board, n)) for n in names]
    axis = "time" if request.query.get("x") == "time" else "step"
    return _html(run_page(runs, axis, board.allow_launch, board.csrf))


async def metrics_api(request: web.Request) -> web.Response:
    board = _board(request)
    names = request.query.getall("run", [])
    dirs = [(n, _run_dir(board, n)) for n in names]
    axis = "time" if request.query.get("x") == "time" else "step"
    data = chart_data([(n, read_metrics(d)) for n, d in dirs], axis)
    data["status"] = {n: (await _describe(board, d)).status for n, d in dirs}
    return web.json_response(data)


async def log_api(request: web.Request) -> web.Response:
    board = _board(request)
    run_dir = _run_dir(board, request.query.get("run", ""))
    await asyncio.to_thread(board.launcher.refresh_log, run_dir)
    log = run_dir / LOG_NAME
    if not log.is_file():
        return web.Response(text="")
    with open(log, "rb") as f:
        f.seek(max(0, log.stat().st_size - LOG_TAIL_BYTES))
        return web.Response(text=f.read().decode(errors="replace"))


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text not in (None, "") else None
    except ValueError:
        return None


async def samples_view(request: web.Request) -> web.Response:
    board = _board(request)
    q = request.query
    rel = q.get("run", "")
    run_dir = _run_dir(board, rel)
    steps = dump_steps(run_dir)
    kind = q.get("kind", "")
    if kind not in KINDS:
        kind = "step" if steps["step"] else "val"
    step = _int(q.get("step"))
    if step is None and steps[kind]:
        step = steps[kind][0]
    every = read_dump(run_dir, kind, step) if step is not None else []
    lo, hi, finish = _float(q.get("min")), _float(q.get("max")), q.get("finish") or None
    shown = keep(every, lo, hi, finish)
    vs = _int(q.get("vs"))
    other = keep(read_dump(run_dir, kind, vs), lo, hi, finish) if vs is not None else None
    finishes = sorted({str(s.get("finish_reason")) for s in every})
    query = {k: q.get(k, "") for k in ("min", "max", "finish")}
    return _html(
        samples_page(rel, kind, step, steps, shown, len(every), finishes, query, vs, other)
    )


async def timeline_view(request: web.Request) -> web.Response:
    board = _board(request)
    rel = request.query.get("run", "")
    path = _run_dir(board, rel) / "trace.json"
    events = await asyncio.to_thread(read_trace, path) if path.is_file() else []
    return _html(timeline_page(rel, events, _int(request.query.get("step"))))


async def _launch_form(
    board: Board,
    form: dict[str, str],
    checked: launching.Plan | None = None,
    command: str = "",
    message: str = "",
) -> web.Response:
    presets = await asyncio.to_thread(launching.group_presets)
    defaults = await asyncio.to_thread(launching.default_values)
    return _html(
        launch_page(
            presets,
            launching.key_rows(),
            defaults,
            form,
            board.allow_launch,
            board.csrf,
            checked=checked,
            command=command,
            message=message,
        )
    )


async def launch_view(request: web.Request) -> web.Response:
    return await _launch_form(_board(request), dict(request.query))


async def launch_post(request: web.Request) -> web.Response:
    board = _board(request)
    form = {k: str(v) for k, v in (await request.post()).items() if k != "csrf"}
    checked = await asyncio.to_thread(launching.plan, board.root, form)
    ray = form.get("target") == "ray"
    address = form.get("address", "").strip() or "http://127.0.0.1:8265"
    job = launching.job_name(checked.run_dir) if checked.run_dir else "rlpost-run"
    if ray:
        command = launching.shown(launching.ray_submit_command(checked.overrides, address, job))
    else:
        command = launching.shown(launching.train_command(checked.overrides))
    if form.get("action") != "launch" or not checked.ok:
        return await _launch_form(board, form, checked=checked, command=command)
    if not board.allow_launch:
        return await _launch_form(
            board, form, checked=checked, command=command,
            message="launching is off: restart the board with --allow-launch",
        )  # fmt: skip
    assert checked.run_dir is not None
    if ray:
        try:
            info = await asyncio.to_thread(
                board.launcher.start_ray, checked.run_dir, checked.overrides, address, job
            )
        except ray_jobs.RayJobError as exc:
            checked.problems["address"] = [str(exc)]
            return await _launch_form(board, form, checked=checked, command=command)
    else:
        info = board.launcher.start_local(checked.run_dir, checked.overrides)
    launching.record_shown(checked.run_dir, info, command)
    rel = checked.run_dir.relative_to(board.root.resolve()).as_posix()
    raise web.HTTPSeeOther(f"/run?run={rel}")


async def stop_post(request: web.Request) -> web.Response:
    board = _board(request)
    if not board.allow_launch:
        raise web.HTTPForbidden(text="stopping runs is off: start the board with --allow-launch")
    form = await request.post()
    rel = str(form.get("run", ""))
    message = await asyncio.to_thread(board.launcher.stop, _run_dir(board, rel))
    back = url("/run", run=rel)
    return _html(page("Stop", f'<p>{esc(message)}</p><p><a href="{back}">back to the run</a></p>'))


async def file_view(request: web.Request) -> web.StreamResponse:
    board = _board(request)
    path = under_root(board.root, request.match_info["tail"])
    if not path.is_file():
        raise web.HTTPNotFound()
    return web.FileResponse(path)


async def static_view(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    if name not in STATIC_FILES:
        raise web.HTTPNotFound()
    return web.Response(
        body=(STATIC / name).read_bytes(), content_type=STATIC_FILES[name], charset="utf-8"
    )


def make_app(board: Board) -> web.Application:
    app = web.Application(middlewares=[guard])
    app[BOARD] = board
    app.add_routes(
        [
            web.get("/", runs_view),
            web.get("/run", run_view),
            web.get("/samples", samples_view),
            web.get("/timeline", timeline_view),
            web.get("/launch", launch_view),
            web.post("/launch", launch_post),
            web.post("/stop", stop_post),
            web.get("/api/metrics", metrics_api),
            web.get("/api/log", log_api),
            web.get("/files/{tail:.*}", file_view),
            web.get("/static/{name}", static_view),
        ]
    )
    return app
