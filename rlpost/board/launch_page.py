"""The launch page: a preset per config group, every key with its type and
help (``rlpost.config.schema.describe``), extra ``key=value`` lines, and the
problems ``compose`` found shown beside the fields they name."""

from __future__ import annotations

from collections.abc import Mapping

from rlpost.board.html import esc, page
from rlpost.board.launch import GENERAL, Plan


def _errors(problems: Mapping[str, list[str]], where: str) -> str:
    items = "".join(f"<li>{esc(p)}</li>" for p in problems.get(where, []))
    return f'<ul class="errors" data-field="{esc(where)}">{items}</ul>' if items else ""


def launch_page(
    presets: dict[str, list[str]],
    keys: list[tuple[str, str, str]],
    defaults: dict[str, str],
    form: Mapping[str, str],
    allow_launch: bool,
    csrf: str,
    checked: Plan | None = None,
    command: str = "",
    message: str = "",
) -> str:
    problems = checked.problems if checked else {}
    notice = ""
    if not allow_launch:
        notice = (
            '<p class="notice">Launching is off. Start the board with '
            "<code>rlpost board --allow-launch</code> to start runs from this page; "
            "you can still check a config and copy its command line.</p>"
        )
    groups = []
    names = list(dict.fromkeys([*presets, *(k.split(".", 1)[0] for k, _, _ in keys)]))
    for group in names:
        options = presets.get(group, [])
        chosen = form.get(f"group.{group}", "")
        opts = "".join(
            f'<option value="{esc(o)}"{" selected" if o == chosen else ""}>{esc(o)}</option>'
            for o in options
        )
        rows = []
        for key, tp, text in keys:
            if key.split(".", 1)[0] != group:
                continue
            name = f"key.{key}"
            value = form.get(name, "")
            bad = " bad" if name in problems else ""
            rows.append(
                f'<tr class="key{bad}" data-key="{esc(key)}"><td><code>{esc(key)}</code></td>'
                f'<td class="type">{esc(tp)}</td>'
                f'<td><input name="{esc(name)}" value="{esc(value)}" '
                f'placeholder="{esc(defaults.get(key, ""))}">{_errors(problems, name)}</td>'
                f"<td>{esc(text)}</td></tr>"
            )
        open_ = " open" if any(k.startswith(f"key.{group}.") for k in problems) else ""
        groups.append(
            f"<fieldset><legend>{esc(group)}</legend>"
            + (
                f'<label>preset <select name="group.{esc(group)}"><option value="">(default)</option>{opts}</select></label>'
                if group in presets
                else ""
            )
            + _errors(problems, f"group.{group}")
            + f"<details{open_}><summary>{len(rows)} keys</summary>"
            f'<table class="keys"><thead><tr><th>key</th><th>type</th><th>value (empty: preset\'s)</th><th>meaning</th></tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table></details></fieldset>"
        )
    target = form.get("target", "local")
    general = _errors(problems, GENERAL)
    result = ""
    if checked is not None:
        verdict = (
            '<p class="ok">The config is valid.</p>'
            if checked.ok
            else f'<p class="bad">{sum(map(len, problems.values()))} problem(s): see beside the fields.</p>'
        )
        result = f'<div class="result">{verdict}{general}<p>Command line:</p><pre class="command">{esc(command)}</pre></div>'
    if message:
        result += f'<p class="notice">{esc(message)}</p>'
    body = f"""{notice}{result}
<form method="post" action="/launch" class="launch">
<input type="hidden" name="csrf" value="{esc(csrf)}">
<p><label>run name (folder under the runs root) <input name="name" value="{esc(form.get("name", ""))}" placeholder="&lt;time&gt;-&lt;algo&gt;"></label>
{_errors(problems, "name")}</p>
<p class="filter"><label>filter keys <input id="keyfilter" placeholder="e.g. total_steps"></label></p>
{"".join(groups)}
<fieldset><legend>more overrides</legend>
<p class="muted">One <code>key=value</code> a line, as on the command line.</p>
<textarea name="extra" rows="4" cols="70">{esc(form.get("extra", ""))}</textarea>{_errors(problems, "extra")}</fieldset>
<fieldset><legend>where</legend>
<label><input type="radio" name="target" value="local"{" checked" if target != "ray" else ""}> local process</label>
<label><input type="radio" name="target" value="ray"{" checked" if target == "ray" else ""}> Ray job at</label>
<input name="address" size="30" value="{esc(form.get("address", ""))}" placeholder="http://127.0.0.1:8265">
{_errors(problems, "address")}</fieldset>
<p><button name="action" value="check">check</button>
<button name="action" value="launch"{"" if allow_launch else " disabled"}>launch</button></p>
</form>"""
    return page("Launch a run", body, "launch")
