"""The code's shape, measured: lines in the middle floor's packages, the places
a setting is declared, ``Any`` in annotations, and the modules of the loop.

    python bench/structure.py                 # this checkout
    python bench/structure.py --root OTHER    # another checkout, e.g. an older commit
                                              # (git archive REV | tar -x -C OTHER)

Prints a table and writes it to ``bench/results/structure.md`` (with
``--out``). Reads the source with ``ast``; runs nothing of it.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

MIDDLE = ("rlpost/loop", "rlpost/serving", "rlpost/workers", "rlpost/config", "rlpost/plan")
PACKAGES = ("algos", "rlpost", "rollout", "runtime", "trainers")
# A user-facing setting -> the name its field carries wherever it is declared.
SETTINGS = {
    "algo.policy_loss.clip_high": "clip_high",
    "trainer.lr": "lr",
    "rollout.weight_sync": "weight_sync",
}


def python_files(root: Path, folder: str) -> list[Path]:
    return sorted((root / folder).rglob("*.py"))


def lines(root: Path, folder: str) -> int:
    return sum(len(p.read_text().splitlines()) for p in python_files(root, folder))


def declarations(root: Path, field: str) -> list[str]:
    """Class-level annotated fields named ``field`` (dataclass and schema fields),
    as ``path:line``; a setting passed on as a plain argument is not counted."""
    out = []
    for package in PACKAGES:
        for path in python_files(root, package):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ClassDef):
                    continue
                for item in node.body:
                    target = getattr(item, "target", None)
                    if isinstance(item, ast.AnnAssign) and isinstance(target, ast.Name):
                        if target.id == field:
                            out.append(f"{path.relative_to(root)}:{item.lineno}")
    return out


def any_annotations(root: Path) -> int:
    """Annotations (arguments, returns, variables) that name ``Any``."""
    count = 0
    for package in PACKAGES:
        for path in python_files(root, package):
            for node in ast.walk(ast.parse(path.read_text())):
                notes: list[ast.expr | None] = []
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    a = node.args
                    every = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
                    notes += [arg.annotation for arg in every if arg is not None]
                    notes.append(node.returns)
                elif isinstance(node, ast.AnnAssign):
                    notes.append(node.annotation)
                for note in notes:
                    if note is not None and any(
                        isinstance(n, ast.Name) and n.id == "Any" for n in ast.walk(note)
                    ):
                        count += 1
    return count


def measure(root: Path) -> dict[str, str]:
    row = {f"lines {folder}/": str(lines(root, folder)) for folder in MIDDLE}
    row["lines, the five"] = str(sum(int(v) for v in row.values()))
    for setting, field in SETTINGS.items():
        row[f"declared: {setting}"] = str(len(declarations(root, field)))
    row["annotations naming Any"] = str(any_annotations(root))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--before", type=Path, help="a second checkout, shown beside --root")
    parser.add_argument("--out", type=Path, help="write the table here (markdown)")
    args = parser.parse_args()
    now = measure(args.root)
    before = measure(args.before) if args.before else None
    head = "| measure | before | now |\n|---|---|---|" if before else "| measure | now |\n|---|---|"
    rows = [f"| {k} | {before[k]} | {v} |" if before else f"| {k} | {v} |" for k, v in now.items()]
    table = "\n".join([head, *rows])
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    for setting, field in SETTINGS.items():
        print(f"{setting}: " + ", ".join(declarations(args.root, field)))


if __name__ == "__main__":
    main()
