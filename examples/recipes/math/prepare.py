"""MATH (Hendrycks et al.) as rlpost trains on it: a boxed final answer.

    python examples/recipes/math/prepare.py SRC OUT [--splits train test]

SRC holds a MATH dataset's hub files as you have them, e.g. ``DigitalLearningGmbH/MATH-lighteval``
(columns ``problem``, ``solution``, ``level``, ``type``) or ``HuggingFaceH4/MATH-500``
(``problem``, ``solution``, ``answer``, ``subject``, ``level``):

- parquet files named ``<split>-*.parquet`` in SRC, ``SRC/data`` or ``SRC/default``, or
- a folder written by ``datasets.load_dataset(...).save_to_disk(SRC)``.

OUT gets ``<split>.parquet`` with the columns ``prompt`` (the problem, asking for a
``\\boxed{}`` answer), ``answer`` (the dataset's ``answer``, else the last ``\\boxed{}``
of its solution), ``level``, ``subject`` and ``data_source`` (``math``). A row whose
answer cannot be found is left out and counted. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rlpost.data.rows import DataError, load_rows
from rlpost.rewards.verifiers.math_answer import last_boxed

INSTRUCTION = "Let's think step by step and put the final answer in \\boxed{}."


def split_rows(src: Path, split: str) -> list[dict]:
    if (src / split / "state.json").is_file():
        return load_rows(src / split)
    for folder in (src, src / "data", src / "default"):
        shards = sorted(folder.glob(f"{split}-*.parquet"))
        if shards:
            return [row for shard in shards for row in load_rows(shard)]
    raise DataError(
        f"{src}: found neither {split}-*.parquet (in it, data/ or default/) nor a saved "
        f"'{split}' split; see this script's docstring for the layouts it reads"
    )


def convert(row: dict) -> dict | None:
    """The rlpost row of one MATH problem, or None when it has no answer to check."""
    answer = row.get("answer") or last_boxed(row.get("solution") or "")
    if not answer:
        return None
    return {
        "prompt": [{"role": "user", "content": f"{row['problem']} {INSTRUCTION}"}],
        "answer": answer,
        "level": row.get("level"),
        "subject": row.get("subject", row.get("type")),
        "data_source": "math",
    }


def prepare(src: Path, out: Path, splits: list[str]) -> dict[str, tuple[int, int]]:
    """Write OUT/<split>.parquet; returns (rows written, rows left out) per split."""
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split in splits:
        raw = split_rows(src, split)
        rows = [r for r in map(convert, raw) if r is not None]
        pq.write_table(pa.Table.from_pylist(rows), out / f"{split}.parquet")
        counts[split] = (len(rows), len(raw) - len(rows))
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path, help="the hub's files of a MATH dataset")
    parser.add_argument("out", type=Path, help="where <split>.parquet goes")
    parser.add_argument("--splits", nargs="+", default=["train", "test"])
    args = parser.parse_args(argv)
    try:
        counts = prepare(args.src, args.out, args.splits)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for split, (n, skipped) in counts.items():
        print(f"{args.out / split}.parquet: {n} rows ({skipped} without an answer left out)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
