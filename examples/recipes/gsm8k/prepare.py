"""GSM8K as rlpost trains on it: chat prompts, the final number as the answer.

    python examples/recipes/gsm8k/prepare.py SRC OUT

SRC holds the hub's files of ``openai/gsm8k`` (config ``main``) as you have them:

- the parquet files (``train-00000-of-00001.parquet``, ``test-00000-of-00001.parquet``,
  in SRC or in ``SRC/main``), or
- a folder written by ``datasets.load_dataset("openai/gsm8k", "main").save_to_disk(SRC)``.

OUT gets ``train.parquet`` and ``test.parquet`` with the columns

- ``prompt``: a system message and the question, asking for ``#### <number>``;
- ``answer``: the number after ``####`` in the reference solution;
- ``solution`` (the whole reference), ``data_source`` (``openai/gsm8k``).

Nothing is downloaded: on a machine with network access fetch the files first
(``huggingface-cli download openai/gsm8k --repo-type dataset --local-dir SRC``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rlpost.data.rows import DataError, load_rows

SYSTEM = (
    "Solve the problem step by step. End with the final answer as a number on its own "
    "line after '#### ', e.g. '#### 42'."
)
SPLITS = ("train", "test")


def split_rows(src: Path, split: str) -> list[dict]:
    """The raw rows of ``split``: a saved folder's split, or its parquet shards."""
    if (src / split / "state.json").is_file():  # a DatasetDict saved to disk
        return load_rows(src / split)
    for folder in (src, src / "main"):
        shards = sorted(folder.glob(f"{split}-*.parquet"))
        if shards:
            return [row for shard in shards for row in load_rows(shard)]
    raise DataError(
        f"{src}: found neither {split}-*.parquet (in it or in main/) nor a saved "
        f"'{split}' split; see this script's docstring for the layouts it reads"
    )


def final_number(solution: str) -> str:
    """The number after the last ``####`` of a GSM8K solution, without commas."""
    if "####" not in solution:
        raise DataError(f"solution without '####': {solution[-80:]!r}")
    return solution.rpartition("####")[2].strip().replace(",", "")


def convert(row: dict) -> dict:
    return {
        "prompt": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": row["question"]},
        ],
        "answer": final_number(row["answer"]),
        "solution": row["answer"],
        "data_source": "openai/gsm8k",
    }


def prepare(src: Path, out: Path) -> dict[str, int]:
    """Write OUT/{train,test}.parquet; returns the row count of each split."""
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split in SPLITS:
        rows = [convert(r) for r in split_rows(src, split)]
        pq.write_table(pa.Table.from_pylist(rows), out / f"{split}.parquet")
        counts[split] = len(rows)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path, help="the hub's files of openai/gsm8k")
    parser.add_argument("out", type=Path, help="where train.parquet and test.parquet go")
    args = parser.parse_args(argv)
    try:
        counts = prepare(args.src, args.out)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for split, n in counts.items():
        print(f"{args.out / split}.parquet: {n} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
