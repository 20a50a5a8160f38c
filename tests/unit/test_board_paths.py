"""The board serves files under its runs root only: ``..``, absolute paths and
symlinks that lead out are refused before anything is read."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlpost.board.paths import Forbidden, relative, under_root
from rlpost.board.runs import find_runs


def test_paths_inside_the_root_resolve(tmp_path: Path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    assert under_root(tmp_path, "a/b") == (tmp_path / "a" / "b").resolve()
    assert under_root(tmp_path, "") == tmp_path.resolve()
    assert relative(tmp_path, tmp_path / "a" / "b") == "a/b"
    assert relative(tmp_path, tmp_path) == ""


@pytest.mark.parametrize(
    "rel", ["..", "../x", "a/../../x", "/etc/passwd", "~/x", "a\\..\\..\\x", "a\x00b", "a/.."]
)
def test_paths_that_leave_the_root_are_refused(tmp_path: Path, rel: str):
    (tmp_path / "a").mkdir()
    with pytest.raises(Forbidden):
        under_root(tmp_path / "a", rel)


def test_a_symlink_out_of_the_root_is_refused_one_inside_is_not(tmp_path: Path):
    root, outside = tmp_path / "runs", tmp_path / "secret"
    (root / "real").mkdir(parents=True)
    outside.mkdir()
    (outside / "config.yaml").write_text("algo: {name: grpo}\n")
    (root / "out").symlink_to(outside)
    (root / "alias").symlink_to(root / "real")
    with pytest.raises(Forbidden):
        under_root(root, "out/config.yaml")
    assert under_root(root, "alias") == (root / "real").resolve()
    # The listing does not follow the link out either.
    assert find_runs(root) == []


def test_runs_are_found_two_levels_down_not_inside_a_run(tmp_path: Path):
    for rel in ("a", "sweep/b", "sweep/c/d/e"):
        (tmp_path / rel).mkdir(parents=True)
    (tmp_path / "a" / "metrics.jsonl").write_text("")
    (tmp_path / "a" / "checkpoints").mkdir()
    (tmp_path / "a" / "checkpoints" / "config.yaml").write_text("")
    (tmp_path / "sweep" / "b" / "config.yaml").write_text("")
    (tmp_path / "sweep" / "c" / "d" / "e" / "config.yaml").write_text("")  # 4 levels: too deep
    found = sorted(relative(tmp_path, p) for p in find_runs(tmp_path))
    assert found == ["a", "sweep/b"]
