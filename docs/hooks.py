"""Build hooks of the documentation site (``mkdocs.yml`` names this file twice).

- The configuration reference's key table is rendered from the schema
  (``rlpost.config.compose.keys_markdown``) at build time, so the site never
  shows a stale one. The copy committed in ``docs/configuration.md`` (what
  GitHub shows) is kept equal by ``tests/unit/test_config.py``; rewrite it with
  ``python docs/hooks.py``.
- Pages link repository files outside ``docs/`` the way GitHub resolves them
  (``../SUPPORT.md``, ``../examples/ray_job.sh``). The site carries a copy of
  each such file under ``repo/`` (and of the files those link, if Markdown),
  and the links are pointed there; a link to a file that does not exist fails
  the build.
- A measured figure on a page is written between figure markers naming the
  committed results file the command beside it writes, the key in it and a
  format: ``<!-- fig bench/results/quickstart.json eval.overall.greedy .3f
  -->0.590<!-- /fig -->``. The site renders the figure from that file; the
  text between the markers (what GitHub shows) is kept equal to it by
  ``tests/unit/test_docs_figures.py``, so a page's figure cannot drift from
  its results file. ``python docs/hooks.py`` rewrites both kinds of block.
- ``RlpostLayers`` is a griffe extension for the API reference: the folders
  ``algos/``, ``rollout/`` and ``trainers/`` install as ``rlpost.algos`` ...
  (``setup.py``), which static analysis of ``rlpost/`` cannot see, so it
  grafts them into the ``rlpost`` package it loads.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

import griffe

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
LAYERS = ("algos", "rollout", "runtime", "trainers")
KEYS_PAGE = DOCS / "configuration.md"
KEYS_RE = re.compile(r"(<!-- keys:start -->\n)(.*?)(\n<!-- keys:end -->)", re.S)
# ](target) of a Markdown link, with an optional #anchor; external links have a scheme.
LINK_RE = re.compile(r"\]\((?![a-z][a-z0-9+.-]*:|#)([^)\s#]+)(#[^)\s]*)?\)")
MIRROR = "repo"
# <!-- fig FILE KEY [FORMAT] -->TEXT<!-- /fig -->: KEY is a dotted path into FILE's
# JSON, FORMAT a format spec (".3f", ".1f", "d"; none: str()).
FIG_RE = re.compile(r"<!-- fig (\S+) (\S+)(?: (\S+))? -->(.*?)<!-- /fig -->", re.S)
# The Markdown files outside docs/ that carry figures.
FIGURE_PAGES_OUTSIDE = ("README.md",)


class FigureError(ValueError):
    """A figure marker whose file or key does not exist."""


def figure(path: str, key: str, fmt: str | None = None) -> str:
    """The value at ``key`` (dotted) of the JSON file ``path`` (repository-relative),
    formatted with ``fmt``."""
    import json

    file = ROOT / path
    if not file.is_file():
        raise FigureError(f"figure {path} {key}: {path} does not exist")
    value = json.loads(file.read_text())
    walked = []
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            have = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise FigureError(
                f"figure {path} {key}: no {part!r} under {'.'.join(walked) or 'the top'} "
                f"(there: {have})"
            )
        walked.append(part)
        value = value[part]
    return format(value, fmt) if fmt else str(value)


def with_figures(markdown: str) -> str:
    """``markdown`` with the text of every figure marker rendered from its results file."""

    def one(m: re.Match[str]) -> str:
        path, key, fmt, _ = m.groups()
        spec = f" {fmt}" if fmt else ""
        return f"<!-- fig {path} {key}{spec} -->{figure(path, key, fmt)}<!-- /fig -->"

    return FIG_RE.sub(one, markdown)


def figure_pages() -> list[Path]:
    """Every page that may carry figures: the docs and the Markdown files beside them."""
    return sorted(DOCS.rglob("*.md")) + [ROOT / p for p in FIGURE_PAGES_OUTSIDE]


def with_keys_table(markdown: str) -> str:
    """``markdown`` with the text between the keys markers replaced by the schema's table."""
    from rlpost.config.compose import keys_markdown

    if not KEYS_RE.search(markdown):
        raise ValueError(f"{KEYS_PAGE}: no <!-- keys:start --> ... <!-- keys:end --> block")
    table = keys_markdown()
    return KEYS_RE.sub(lambda m: m.group(1) + table + m.group(3), markdown)


def _real_path(src_uri: str) -> str:
    """Where the page ``src_uri`` of the site lives in the repository."""
    if src_uri.startswith(f"{MIRROR}/"):
        return src_uri[len(MIRROR) + 1 :]
    return f"docs/{src_uri}"


def _site_path(repo_path: str) -> str:
    """The site's ``src_uri`` of the repository file ``repo_path``."""
    if repo_path.startswith("docs/"):
        return repo_path[len("docs/") :]
    return f"{MIRROR}/{repo_path}"


def _link_targets(real_path: str, markdown: str):
    """(match, repository path) for each relative link of a page at ``real_path``."""
    base = posixpath.dirname(real_path)
    for m in LINK_RE.finditer(markdown):
        target = posixpath.normpath(posixpath.join(base, m.group(1)))
        if not target.startswith("../"):
            yield m, target


def _mirrored_files() -> set[str]:
    """Repository files outside docs/ that the pages link, and those they link in turn."""
    wanted: set[str] = set()
    todo = [p.relative_to(ROOT).as_posix() for p in DOCS.rglob("*.md")]
    while todo:
        real = todo.pop()
        for _, target in _link_targets(real, (ROOT / real).read_text()):
            if target.startswith("docs/") or target in wanted or not (ROOT / target).is_file():
                continue
            wanted.add(target)
            if target.endswith(".md"):
                todo.append(target)
    return wanted


def on_files(files, config):
    from mkdocs.structure.files import File, InclusionLevel

    for target in sorted(_mirrored_files()):
        uri = _site_path(target)
        files.append(
            File.generated(
                config, uri, abs_src_path=str(ROOT / target), inclusion=InclusionLevel.NOT_IN_NAV
            )
        )
    return files


def on_page_markdown(markdown, page, config, files):
    src_uri = page.file.src_uri
    real = _real_path(src_uri)
    if real == KEYS_PAGE.relative_to(ROOT).as_posix():
        markdown = with_keys_table(markdown)
    markdown = with_figures(markdown)
    out, last = [], 0
    for m, target in _link_targets(real, markdown):
        if not (ROOT / target).is_file():
            continue  # mkdocs reports the broken link (strict: fails the build)
        link = posixpath.relpath(_site_path(target), posixpath.dirname(src_uri) or ".")
        out += [markdown[last : m.start()], f"]({link}{m.group(2) or ''})"]
        last = m.end()
    return "".join(out) + markdown[last:]


class RlpostLayers(griffe.Extension):
    """Load ``algos/``, ``rollout/``, ``trainers/`` as ``rlpost.algos`` ... (see setup.py)."""

    def on_package(self, *, pkg, loader, **kwargs) -> None:
        if pkg.name != "rlpost":
            return
        for layer in LAYERS:
            if layer in pkg.members:
                continue
            mod = loader.load(layer, try_relative_path=False)
            loader.modules_collection.del_member(layer)
            pkg.set_member(layer, mod)


if __name__ == "__main__":
    KEYS_PAGE.write_text(with_keys_table(KEYS_PAGE.read_text()))
    print(f"wrote {KEYS_PAGE.relative_to(ROOT)}")
    for page in figure_pages():
        text = page.read_text()
        rendered = with_figures(text)
        if rendered != text:
            page.write_text(rendered)
            print(f"wrote {page.relative_to(ROOT)}")
