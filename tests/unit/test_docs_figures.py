"""Every measured figure a page quotes between figure markers is the one its
committed results file holds (docs/hooks.py renders the site from those files;
this keeps the text GitHub shows equal to them), so figure and command cannot
drift apart unnoticed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = load_hooks()


def markers():
    for page in hooks.figure_pages():
        for m in hooks.FIG_RE.finditer(page.read_text()):
            yield page.relative_to(ROOT).as_posix(), m


def test_every_figure_on_a_page_equals_its_results_file():
    stale = [
        f"{page}: {m.group(0)!r} should read {hooks.figure(*m.groups()[:3])!r}"
        for page, m in markers()
        if m.group(4) != hooks.figure(*m.groups()[:3])
    ]
    assert not stale, "run `python docs/hooks.py` to rewrite them:\n" + "\n".join(stale)


def test_the_pages_that_quote_the_quick_start_and_the_evaluation_use_markers():
    pages = {page for page, _ in markers()}
    assert {"README.md", "docs/evaluation.md", "docs/getting-started.md", "docs/async.md"} <= pages
    keys = {m.group(2) for _, m in markers()}
    assert {"eval.overall.greedy", "eval.overall.pass@16", "quickstart.wall_min"} <= keys


def test_a_marker_is_rendered_from_the_file_with_its_format():
    text = (
        "greedy <!-- fig bench/results/doc_figures.json eval.overall.greedy .2f -->x<!-- /fig -->"
    )
    value = hooks.figure("bench/results/doc_figures.json", "eval.overall.greedy")
    assert hooks.with_figures(text) == text.replace(">x<", f">{float(value):.2f}<")


@pytest.mark.parametrize(
    "path, key, names",
    [
        (
            "bench/results/doc_figures.json",
            "eval.overall.greedyy",
            "no 'greedyy' under eval.overall",
        ),
        ("bench/results/nothing.json", "a", "bench/results/nothing.json does not exist"),
    ],
)
def test_a_marker_naming_a_missing_key_or_file_fails_the_build(path, key, names):
    with pytest.raises(hooks.FigureError, match=names):
        hooks.figure(path, key)
