"""The documented Ray-job commands work as written on a default cluster: Ray
2.60's ``ray start --head`` turns token authentication on, and a client that is
not in token mode is refused."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _commands(text: str) -> list[str]:
    """The shell commands in ``text``'s fenced blocks, continuation lines joined."""
    blocks = re.findall(r"```(?:bash|sh|shell)?\n(.*?)```", text, flags=re.S)
    return [c for b in blocks for c in b.replace("\\\n", " ").splitlines()]


def test_every_documented_job_submission_uses_token_auth():
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    submits = [
        (page.name, c)
        for page in pages
        for c in _commands(page.read_text())
        if "ray job submit" in c and not c.lstrip().startswith("#")
    ]
    assert submits, "the docs show how to submit a job"
    assert [s for s in submits if "RAY_AUTH_MODE=token" not in s[1]] == []
    script = (REPO / "examples" / "ray_job.sh").read_text()
    assert "export RAY_AUTH_MODE=token" in script
