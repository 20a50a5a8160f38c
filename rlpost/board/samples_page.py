"""The samples page: one step's rollout dump (or two side by side, paired by
prompt), chats drawn turn by turn. All model text is escaped."""

from __future__ import annotations

import json

from rlpost.board.html import esc, fmt, page, url
from rlpost.board.samples import DumpRow, message_kind, pair_by_prompt, total


def _text(value: object) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=1, default=str)


def _prompt(prompt: object) -> str:
    if isinstance(prompt, list):
        return "\n".join(
            f"[{m.get('role')}] {_text(m.get('content'))}" if isinstance(m, dict) else _text(m)
            for m in prompt
        )
    return _text(prompt)


def _tool_calls(calls: object) -> str:
    out = []
    for call in calls if isinstance(calls, list) else []:
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        args = fn.get("arguments")
        out.append(
            f'<div class="toolcall"><span class="tag">tool call</span> '
            f"<code>{esc(fn.get('name', '?'))}({esc(args if isinstance(args, str) else json.dumps(args))})</code></div>"
        )
    return "".join(out)


def chat(messages: list[object]) -> str:
    """A multi-turn episode: prompt, model text, tool calls, tool results and
    environment messages each in their own style."""
    out = []
    for i, msg in enumerate(messages):
        kind = message_kind(messages, i)
        m = msg if isinstance(msg, dict) else {"content": msg}
        label = {
            "model": "model",
            "tool": f"tool result: {m.get('name', '')}",
            "env": "environment",
        }
        content = _text(m.get("content") or "")
        body = f'<pre class="text">{esc(content)}</pre>' if content else ""
        out.append(
            f'<div class="msg {kind}"><span class="tag">{esc(label.get(kind, kind))}</span>'
            f"{body}{_tool_calls(m.get('tool_calls'))}</div>"
        )
    return f'<div class="chat">{"".join(out)}</div>'


def sample_card(s: DumpRow) -> str:
    rewards = s.get("rewards")
    rewards = rewards if isinstance(rewards, dict) else {}
    scores = " ".join(
        f'<span class="score{" total" if k == "total" else ""}">{esc(k)} {esc(fmt(v))}</span>'
        for k, v in rewards.items()
    )
    facts = [
        ("advantage", s.get("advantage")), ("length", s.get("length")),
        ("finish", s.get("finish_reason")), ("policy version", s.get("policy_version")),
        ("turns", s.get("turns")), ("answer", s.get("answer")),
    ]  # fmt: skip
    meta = " &middot; ".join(f"{esc(k)} <b>{esc(fmt(v))}</b>" for k, v in facts if v is not None)
    messages = s.get("messages")
    if isinstance(messages, list):
        content = chat(messages)
    else:
        content = f'<pre class="text completion">{esc(_text(s.get("completion", "")))}</pre>'
    return (
        f'<div class="sample" data-total="{esc(fmt(total(s)))}">'
        f'<div class="scores">{scores}</div><div class="meta">{meta}</div>{content}</div>'
    )


def samples_page(
    run: str,
    kind: str,
    step: int | None,
    steps: dict[str, list[int]],
    shown: list[DumpRow],
    count: int,
    finishes: list[str],
    query: dict[str, str],
    vs: int | None = None,
    other: list[DumpRow] | None = None,
) -> str:
    links = []
    for k, label in (("step", "training"), ("val", "validation")):
        items = " ".join(
            f'<a class="{"on" if (k == kind and s == step) else ""}" '
            f'href="{url("/samples", run=run, kind=k, step=s)}">{s}</a>'
            for s in steps.get(k, [])
        )
        links.append(f"<div class=steps><b>{label}</b> {items or '(none)'}</div>")
    opts = "".join(
        f'<option value="{esc(f)}"{" selected" if query.get("finish") == f else ""}>{esc(f)}</option>'
        for f in finishes
    )
    vs_opts = "".join(
        f'<option value="{s}"{" selected" if s == vs else ""}>{s}</option>'
        for s in steps.get(kind, [])
        if s != step
    )
    form = f"""<form class="filters" method="get" action="/samples">
<input type="hidden" name="run" value="{esc(run)}"><input type="hidden" name="kind" value="{esc(kind)}">
<input type="hidden" name="step" value="{esc(fmt(step))}">
<label>reward &ge; <input name="min" size="5" value="{esc(query.get("min", ""))}"></label>
<label>reward &le; <input name="max" size="5" value="{esc(query.get("max", ""))}"></label>
<label>finish <select name="finish"><option value="">any</option>{opts}</select></label>
<label>side by side with step <select name="vs"><option value="">-</option>{vs_opts}</select></label>
<button>apply</button></form>"""
    if step is None:
        body = "<p>This run has no rollout dumps: run with <code>trainer.log_samples=N</code>.</p>"
    elif other is not None:
        rows = []
        for _, left, right in pair_by_prompt(shown, other):
            prompt = _prompt((left or right)[0].get("prompt"))
            cols = "".join(
                f'<div class="col">{"".join(sample_card(s) for s in side) or "<p class=muted>not in this step</p>"}</div>'
                for side in (left, right)
            )
            rows.append(
                f'<div class="pair"><pre class="prompt">{esc(prompt)}</pre><div class="cols">{cols}</div></div>'
            )
        body = (
            f'<div class="cols head"><div class="col"><b>step {esc(step)}</b></div>'
            f'<div class="col"><b>step {esc(vs)}</b></div></div>{"".join(rows)}'
        )
    if step is not None and other is None:
        grouped: dict[str, list[str]] = {}
        # One prompt shown once above its group's samples.
        for s in shown:
            grouped.setdefault(_prompt(s.get("prompt")), []).append(sample_card(s))
        body = f'<p class="muted">{len(shown)} of {count} samples</p>' + "".join(
            f'<div class="group"><pre class="prompt">{esc(p)}</pre><div class="samples">{"".join(c)}</div></div>'
            for p, c in grouped.items()
        )
    title = f"{run} samples" + (
        f": {'validation' if kind == 'val' else 'step'} {step}" if step is not None else ""
    )
    back = f'<p><a href="{url("/run", run=run)}">curves</a></p>'
    return page(title, back + "".join(links) + form + body)
