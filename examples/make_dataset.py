"""Write a small string-reversal dataset in rlpost's row format.

    python examples/make_dataset.py DIR [--train 512] [--val 64] [--seed 0]

writes ``DIR/train.jsonl`` and ``DIR/val.parquet``. Each row is

    {"prompt": [{"role": "system", "content": "Reverse the letters."},
                {"role": "user", "content": "kfzq"}],
     "answer": "qzfk", "data_source": "reverse"}

``prompt`` is a list of chat messages (a plain string is accepted too); every
other field travels with the row to the reward function. Train and held-out
words never overlap. Either file type works for either split: rlpost reads
``.jsonl``, ``.json`` and ``.parquet``.
"""

from __future__ import annotations

import argparse
import json
import random
import string
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SYSTEM = "Reverse the letters."


def make_rows(num: int, rng: random.Random, seen: set[str]) -> list[dict]:
    """``num`` rows with distinct words of 2-5 lowercase letters not in ``seen``."""
    rows: list[dict] = []
    while len(rows) < num:
        word = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 5)))
        if word in seen:
            continue
        seen.add(word)
        prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": word}]
        rows.append({"prompt": prompt, "answer": word[::-1], "data_source": "reverse"})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="directory to write train.jsonl and val.parquet")
    parser.add_argument("--train", type=int, default=512, help="training rows")
    parser.add_argument("--val", type=int, default=64, help="held-out rows")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    seen: set[str] = set()
    train = make_rows(args.train, rng, seen)
    val = make_rows(args.val, rng, seen)

    args.out_dir.mkdir(parents=True, exist_ok=True)
    with open(args.out_dir / "train.jsonl", "w") as f:
        for row in train:
            f.write(json.dumps(row) + "\n")
    pq.write_table(pa.Table.from_pylist(val), args.out_dir / "val.parquet")
    print(f"wrote {len(train)} rows to {args.out_dir / 'train.jsonl'}")
    print(f"wrote {len(val)} rows to {args.out_dir / 'val.parquet'}")


if __name__ == "__main__":
    main()
