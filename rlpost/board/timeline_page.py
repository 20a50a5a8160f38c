"""The timeline page: one step of a run's ``trace.json`` drawn as lanes of spans
(the controller, each trainer rank, each rollout replica), the critical path
outlined, with the path as a table beneath. Server-drawn SVG: no script needed."""

from __future__ import annotations

from rlpost.board.html import esc, page, table, url
from rlpost.loop.trace_file import critical_path, lane_names, step_spans
from rlpost.runtime.spans import Event

WIDTH, LABEL, ROW, PAD = 1100, 170, 16, 3
COLOURS = {  # by span category
    "step": "#4e79a7", "rollout": "#59a14f", "segment": "#8cd17d", "reward": "#edc948",
    "trainer": "#f28e2b", "micro": "#ffbe7d", "sync": "#b07aa1",
}  # fmt: skip


def _f(e: Event, key: str) -> float:
    return float(e[key])  # type: ignore[arg-type]


def trace_steps(events: list[Event]) -> list[int]:
    return [
        int(e["args"]["step"])  # type: ignore[index,call-overload]
        for e in events
        if e.get("name") == "step" and isinstance(e.get("args"), dict)
    ]


def timeline_svg(outer: Event, spans: list[Event], lanes: dict[int, str]) -> str:
    """The step's spans as rows: one per lane, and per overlapping row (``tid``) in it."""
    t0, dur = _f(outer, "ts"), max(_f(outer, "dur"), 1.0)
    scale = (WIDTH - LABEL - 10) / dur
    on_path = {id(e) for e in critical_path(outer, spans)}
    rows = sorted({(int(e["pid"]), int(e.get("tid", 0))) for e in [outer, *spans]})  # type: ignore[call-overload]
    y_of = {r: 24 + i * (ROW + PAD) for i, r in enumerate(rows)}
    height = 24 + len(rows) * (ROW + PAD) + 8
    out = [f'<svg class="timeline" width="{WIDTH}" height="{height}" '
           f'viewBox="0 0 {WIDTH} {height}" xmlns="http://www.w3.org/2000/svg">']  # fmt: skip
    for k in range(11):  # the axis: tenths of the step
        x = LABEL + k * (WIDTH - LABEL - 10) / 10
        out.append(f'<line x1="{x:.1f}" y1="14" x2="{x:.1f}" y2="{height}" stroke="#ddd"/>')
        out.append(f'<text x="{x:.1f}" y="11" font-size="10" text-anchor="middle">'
                   f"{k * dur / 10 / 1e6:.2f}s</text>")  # fmt: skip
    seen: set[int] = set()
    for pid, tid in rows:
        if pid not in seen:  # the lane's name on its first row
            seen.add(pid)
            out.append(f'<text x="4" y="{y_of[pid, tid] + ROW - 4}" font-size="11">'
                       f"{esc(lanes.get(pid, pid))}</text>")  # fmt: skip
    for e in [outer, *spans]:
        start = max(_f(e, "ts"), t0)
        end = min(_f(e, "ts") + _f(e, "dur"), t0 + dur)
        x, w = LABEL + (start - t0) * scale, max((end - start) * scale, 0.8)
        y = y_of[int(e["pid"]), int(e.get("tid", 0))]  # type: ignore[call-overload]
        inset = 4 if e.get("cat") == "segment" else 0
        colour = "#dde3ea" if e is outer else COLOURS.get(str(e.get("cat")), "#bab0ac")
        stroke = ' stroke="#000" stroke-width="2"' if id(e) in on_path else ""
        tip = f"{e['name']}: {_f(e, 'dur') / 1e3:.1f} ms"
        args = e.get("args")
        if isinstance(args, dict):
            tip += " " + ", ".join(f"{k}={v}" for k, v in args.items())
        out.append(
            f'<rect class="span" data-name="{esc(e["name"])}" x="{x:.1f}" y="{y + inset / 2}" '
            f'width="{w:.1f}" height="{ROW - inset}" fill="{colour}"{stroke}>'
            f"<title>{esc(tip)}</title></rect>"
        )
    out.append("</svg>")
    return "".join(out)


def timeline_page(rel: str, events: list[Event], step: int | None) -> str:
    steps = trace_steps(events)
    head = f'<h1>timeline: {esc(rel)}</h1><p><a href="{url("/run", run=rel)}">curves</a> &middot; <a href="{url("/files/" + rel + "/trace.json")}">trace.json</a> (opens in ui.perfetto.dev or chrome://tracing)</p>'
    if not steps:
        body = (
            head
            + "<p>No step in trace.json yet (trainer.trace=off, or the first step is running).</p>"
        )
        return page(f"timeline {rel}", body)
    if step not in steps:
        step = steps[-1]
    outer, spans = step_spans(events, step)
    assert outer is not None
    lanes = lane_names(events)
    i = steps.index(step)
    nav = " ".join(
        f'<a href="{url("/timeline", run=rel, step=s)}">{label}</a>'
        for s, label in ((steps[max(i - 1, 0)], "&larr; previous"), (steps[min(i + 1, len(steps) - 1)], "next &rarr;"))
    )  # fmt: skip
    dur = _f(outer, "dur")
    path = critical_path(outer, spans)
    rows = [
        [esc(lanes.get(int(e["pid"]), e["pid"])), esc(e["name"]),  # type: ignore[call-overload]
         f"{(_f(e, 'ts') - _f(outer, 'ts')) / 1e3:.1f}", f"{_f(e, 'dur') / 1e3:.1f}",
         f"{100 * _f(e, 'dur') / dur:.1f} %"]
        for e in path
    ]  # fmt: skip
    body = (
        head
        + f"<p>step <b>{step}</b> of {steps[0]}&ndash;{steps[-1]}: {dur / 1e6:.3f} s. {nav}</p>"
        + '<p class="legend">outlined: the critical path (the controller\'s named steps and, in each, the span it waited for)</p>'
        + timeline_svg(outer, spans, lanes)
        + "<h2>critical path</h2>"
        + table(["lane", "span", "start (ms)", "duration (ms)", "of the step"], rows, "path")
    )
    return page(f"timeline {rel} step {step}", body)
