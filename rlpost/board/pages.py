"""The runs page and a run's curves page (one run, or several overlaid)."""

from __future__ import annotations

from rlpost.board.html import esc, fmt, page, table, url
from rlpost.board.runs import Run


def runs_page(runs: list[Run], root: str) -> str:
    rows = []
    for r in runs:
        head = ""
        if r.headline:
            key, first, last = r.headline
            head = f"{esc(key)} {first:.3f} &rarr; {last:.3f}"
        step = "" if r.step is None else f"{r.step}"
        if r.total_steps is not None:
            step += f" / {r.total_steps}"
        status = f'<span class="status {esc(r.status)}">{esc(r.status)}</span>'
        if r.error:
            status += f'<div class="error">{esc(r.error)}</div>'
        if r.checkpoint:
            status += f'<div class="checkpoint">checkpoint of step {r.checkpoint[0]}</div>'
        rows.append(
            [
                f'<input type="checkbox" name="run" value="{esc(r.rel)}" form="compare">',
                f'<a class="run" href="{url("/run", run=r.rel)}">{esc(r.rel or ".")}</a>',
                esc(r.algo),
                esc(r.model),
                esc(r.data),
                status,
                esc(step),
                head,
                f'<a href="{url("/samples", run=r.rel)}">samples</a>',
            ]
        )
    listing = (
        table(
            ["", "run", "algo", "model", "data", "status", "step", "headline", ""],
            rows,
            "runs",
        )
        if runs
        else "<p>No run directories yet (a folder with config.yaml or metrics.jsonl).</p>"
    )
    body = f"""<p class="muted">Runs under <code>{esc(root)}</code>; this page refreshes
every 5 s.</p>
<form id="compare" action="/run" method="get">
<button type="submit">compare checked runs</button>
<label>x axis <select name="x"><option value="step">step</option>
<option value="time">wall time (cumulative timing/step_s)</option></select></label>
</form>
<div data-refresh="5000">{listing}</div>"""
    return page("Runs", body, "runs")


def run_page(runs: list[Run], axis: str, allow_launch: bool, csrf: str) -> str:
    """Curves of ``runs`` (overlaid when more than one); the data comes from
    ``/api/metrics`` and is polled while any of them is running."""
    names = [r.rel for r in runs]
    params = "&".join(f"run={esc(n)}" for n in names)
    other = "time" if axis == "step" else "step"
    info = []
    for r in runs:
        status = f'<span class="status {esc(r.status)}" data-status-of="{esc(r.rel)}">{esc(r.status)}</span>'
        line = (
            f"<li><b>{esc(r.rel)}</b> {status} algo {esc(r.algo)}, model {esc(r.model)}, "
            f"data {esc(r.data)}, step {esc(fmt(r.step))}"
            + (f" / {r.total_steps}" if r.total_steps is not None else "")
            + f' &middot; <a href="{url("/samples", run=r.rel)}">samples</a>'
            + f' &middot; <a href="{url("/timeline", run=r.rel)}">timeline</a>'
            + f' &middot; <a href="{url("/files/" + r.rel + "/config.yaml")}">config.yaml</a>'
        )
        if r.error:
            line += f'<div class="error">{esc(r.error)}</div>'
        if r.checkpoint:
            step, rel = r.checkpoint
            line += (
                f'<div class="checkpoint">checkpoint of step {step}: <code>{esc(r.path / rel)}</code> '
                f"(the same command, trainer.resume=auto, goes on from step {step + 1})</div>"
            )
        if r.launch:
            command = r.launch.get("shown") or ""
            line += f'<pre class="command">{esc(command)}</pre>'
            if allow_launch and r.status == "running":
                how = "ray job stop, SIGTERM" if r.launch.get("kind") == "ray" else "SIGINT"
                line += (
                    f'<form method="post" action="/stop" class="stop">'
                    f'<input type="hidden" name="run" value="{esc(r.rel)}">'
                    f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
                    f"<button>stop ({how}: checkpoint, then exit)</button></form>"
                )
            line += (
                f'<details><summary>log</summary><pre class="log" '
                f'data-log="{url("/api/log", run=r.rel)}"></pre></details>'
            )
        info.append(line + "</li>")
    title = names[0] if len(names) == 1 else f"{len(names)} runs compared"
    body = f"""<ul class="runinfo">{"".join(info)}</ul>
<p>x axis: <b>{esc(axis)}</b> &middot; <a href="/run?{params}&x={other}">by {other}</a></p>
<div id="charts" data-src="/api/metrics?{params}&x={esc(axis)}"></div>
<div id="tip" class="tip" hidden></div>"""
    return page(title or "run", body)
