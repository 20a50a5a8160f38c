"""Two-operand addition: the built-in verifiable task.

A prompt is one user message ``"37+48="``; the expected completion is the
sum's decimal digits, ``"85"``, followed by the model's end token. The same
string is the supervised warm-up target (``row["response"]``) and what
:func:`correctness` accepts, so SFT and RL agree on the format.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

DATA_SOURCE = "arith"
# Chat models spell their special tokens "<|...|>" (ours "<|end|>", Qwen's
# "<|im_end|>"); a completion decoded with special tokens is cut there.
SPECIAL_TOKEN_PREFIX = "<|"


def split_pairs(
    low: int, high: int, num_val: int, seed: int
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """All ordered pairs with operands in ``[low, high]``, shuffled by ``seed``:
    (training pairs, the ``num_val`` held-out pairs); the two share no pair."""
    span = range(low, high + 1)
    pairs = [(a, b) for a in span for b in span]
    random.Random(seed).shuffle(pairs)
    return pairs[num_val:], pairs[:num_val]


@dataclass(frozen=True)
class ArithTask:
    """All pairs ``(a, b)`` with ``0 <= a, b <= max_operand``, split by ``seed``.

    ``num_val`` ordered pairs are held out for validation; the rest are the
    training set. Both lists are deterministic functions of the fields and
    share no pair, so validation accuracy measures generalisation.
    """

    seed: int = 0
    max_operand: int = 99
    num_val: int = 200
    # the fields sft_rows depends on (num_val: held-out pairs are not trained on)
    SFT_FIELDS: ClassVar[tuple[str, ...]] = ("seed", "max_operand", "num_val")

    def __post_init__(self) -> None:
        if self.max_operand < 1:
            raise ValueError(f"max_operand must be >= 1, got {self.max_operand}")
        n_pairs = (self.max_operand + 1) ** 2
        if not 0 <= self.num_val < n_pairs:
            raise ValueError(
                f"num_val must be in [0, {n_pairs}) for max_operand={self.max_operand}, "
                f"got {self.num_val}"
            )

    def _split(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        return split_pairs(0, self.max_operand, self.num_val, self.seed)

    def train_rows(self) -> list[dict]:
        """Every pair not held out, in a seeded shuffled order."""
        return [make_row(a, b) for a, b in self._split()[0]]

    def val_rows(self) -> list[dict]:
        """The ``num_val`` held-out pairs."""
        return [make_row(a, b) for a, b in self._split()[1]]

    def sft_rows(self) -> list[dict]:
        """Training rows with the assistant target in ``"response"``."""
        return [{**row, "response": row["answer"]} for row in self.train_rows()]


def make_row(a: int, b: int) -> dict:
    return {
        "prompt": [{"role": "user", "content": f"{a}+{b}="}],
        "answer": str(a + b),
        "data_source": DATA_SOURCE,
    }


def _answer_text(completion: str) -> str:
    """The completion up to its first special token, stripped of whitespace."""
    return completion.split(SPECIAL_TOKEN_PREFIX, 1)[0].strip()


def answer_text(completion: str) -> str:
    """The answer a completion gives, as :func:`correctness` reads it."""
    return _answer_text(completion)


def near_misses(answer: str, other: str) -> list[str]:
    """Wrong answers a reward model must rank below ``answer`` (a sum's digits) besides
    those a policy samples: one off in each of the last three digits (+-1, +-10,
    +-100), +-20, the sum rounded down to tens, 100, and ``other`` (another prompt's
    sum), each once, none negative. A reward model trained only on a policy's near
    misses leaves these unranked, and RL against it finds them (docs/preference.md)."""
    s = int(answer)
    found = [s + d for d in (1, -1, 10, -10, 20, -20, 100, -100)]
    found += [s // 10 * 10, 100, int(other)]
    return [str(c) for c in dict.fromkeys(found) if c >= 0 and c != s]


def correctness(completion: str, row: dict) -> float:
    """1.0 iff the completion (up to the end token, stripped) is the answer."""
    return float(_answer_text(completion) == row["answer"])


def format_reward(completion: str, row: dict) -> float:
    """1.0 iff the completion (up to the end token, stripped) is only digits."""
    text = _answer_text(completion)
    # str.isdigit accepts e.g. superscripts; the answers are ASCII digits.
    return float(text.isascii() and text.isdigit())


def reward(completion: str, row: dict) -> dict[str, float]:
    """Named rewards for the task; the default total is ``correctness`` alone."""
    return {"correctness": correctness(completion, row), "format": format_reward(completion, row)}


reward.default_weights = {"correctness": 1.0, "format": 0.0}  # type: ignore[attr-defined]
