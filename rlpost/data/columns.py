"""Rows as people have them, turned into prompt rows: column names mapped,
raw questions put into a template and a system prompt added.

- ``data.prompt_key``: the column that holds the prompt (a string or chat
  messages), copied to ``prompt``;
- ``data.prompt_template``: instead, the prompt is built from the row's
  columns, e.g. ``"{question}\\nPut the final answer after ####."``; a
  ``{name}`` is a column, ``{{`` and ``}}`` are literal braces, and braces
  around anything that is not a name (``\\boxed{}``) are left as they are;
- ``data.answer_key``: the column the rewards read as ``answer``;
- ``data.system_prompt``: a system message before the prompt (a row whose
  prompt already starts with one keeps its own, counted in a warning).

The original columns stay in the row, so a reward can still read them.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING

from rlpost.data.rows import DataError

if TYPE_CHECKING:
    from rlpost.config.task_groups import DataConfig

log = logging.getLogger(__name__)

FIELD = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")


def template_fields(template: str) -> list[str]:
    """The column names ``template`` fills, in order of first use."""
    names: list[str] = []
    for m in FIELD.finditer(template):
        if m.group(1) and m.group(1) not in names:
            names.append(m.group(1))
    return names


def fill_template(template: str, row: dict) -> str:
    """``template`` with each ``{name}`` replaced by ``str(row[name])``."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) in ("{{", "}}"):
            return m.group(0)[0]
        return str(row[m.group(1)])

    return FIELD.sub(one, template)


def shape_rows(rows: list[dict], data: DataConfig, source: str) -> list[dict]:
    """``rows`` of ``source`` (a file, for messages) mapped by ``data``'s
    prompt_key / prompt_template / answer_key / system_prompt. A column that
    some rows lack is a :class:`DataError` naming the key, the rows and the
    columns there are; rows that are not objects pass through (validation
    counts them)."""
    dicts = [r for r in rows if isinstance(r, dict)]
    columns = sorted({k for r in dicts for k in r})
    needed: list[tuple[str, str]] = []  # (config key, column)
    if data.prompt_template is not None:
        fields = template_fields(data.prompt_template)
        if not fields:
            raise DataError(
                f"data.prompt_template={data.prompt_template!r} names no column; write the "
                "question's column in braces, e.g. '{question}'"
            )
        needed += [("data.prompt_template", f) for f in fields]
    elif data.prompt_key != "prompt":
        needed.append(("data.prompt_key", data.prompt_key))
    if data.answer_key != "answer":
        needed.append(("data.answer_key", data.answer_key))
    for key, column in needed:
        lacking = [i for i, r in enumerate(rows) if isinstance(r, dict) and column not in r]
        if lacking:
            raise DataError(
                f"{key}: {source}: {len(lacking)} of {len(rows)} rows have no column "
                f"{column!r} (first: row {lacking[0]}); its columns are {columns}. "
                f"Name one of them in {key}"
            )
    kept_system = 0
    out: list[dict] = []
    for row in rows:
        if not isinstance(row, dict):
            out.append(row)
            continue
        row = dict(row)
        if data.prompt_template is not None:
            row["prompt"] = fill_template(data.prompt_template, row)
        elif data.prompt_key != "prompt":
            row["prompt"] = row[data.prompt_key]
        if data.answer_key != "answer":
            row["answer"] = row[data.answer_key]
        if data.system_prompt is not None and "prompt" in row:
            row["prompt"], kept = _with_system(row["prompt"], data.system_prompt)
            kept_system += kept
        out.append(row)
    if kept_system:
        log.warning(
            "%s: %d rows' prompts start with their own system message, which they keep; "
            "data.system_prompt is given to the others",
            source, kept_system,
        )  # fmt: skip
    return out


def _with_system(prompt: object, system: str) -> tuple[object, int]:
    if isinstance(prompt, str):
        return [{"role": "system", "content": system}, {"role": "user", "content": prompt}], 0
    if isinstance(prompt, list):
        if prompt and isinstance(prompt[0], dict) and prompt[0].get("role") == "system":
            return prompt, 1
        return [{"role": "system", "content": system}, *prompt], 0
    return prompt, 0  # not a prompt: validation says why
