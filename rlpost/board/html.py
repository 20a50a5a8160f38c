"""HTML helpers: every piece of text from a run (model output included) goes
through ``esc``; pages load only the board's own script and stylesheet (the
Content-Security-Policy set by the server forbids inline scripts)."""

from __future__ import annotations

import html
from collections.abc import Iterable
from urllib.parse import urlencode


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def url(path: str, **params: object) -> str:
    """``path?params`` (None values left out), escaped for an attribute."""
    query = urlencode([(k, str(v)) for k, v in params.items() if v is not None and v != ""])
    return esc(f"{path}?{query}" if query else path)


def fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def table(head: Iterable[str], rows: Iterable[Iterable[str]], cls: str = "") -> str:
    """A table; ``rows`` hold HTML already escaped by the caller."""
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{esc(cls)}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def page(title: str, body: str, active: str = "") -> str:
    nav = "".join(
        f'<a href="{href}"{" class=on" if name == active else ""}>{name}</a>'
        for name, href in (("runs", "/"), ("launch", "/launch"))
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)} - rlpost board</title>
<link rel="stylesheet" href="/static/board.css">
<script src="/static/board.js" defer></script>
</head><body>
<header><b>rlpost board</b> <nav>{nav}</nav></header>
<main>
<h1>{esc(title)}</h1>
{body}
</main></body></html>"""
