"""``reward.fn=gsm8k`` and ``gsm8k_flexible``: GSM8K's ``#### <number>`` answers, as verl scores them.

- ``gsm8k`` (strict): the number after the completion's last ``#### `` is its
  answer; a completion without ``#### <number>`` scores 0. This is verl's
  default, and it rewards the format as well as the number.
- ``gsm8k_flexible``: the last number anywhere in the completion is its
  answer, whatever the format.

Like verl, only the last ``MAX_CHARS`` characters of a completion are read.
Unlike verl, numbers compare by value: commas and ``$`` are dropped, and
``72``, ``72.0`` and ``72.00`` are equal. The row's answer may be a bare number
or a whole GSM8K solution ending in ``#### 72``.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from rlpost.rewards.verifiers.columns import reference_answer

MAX_CHARS = 300  # verl's _SOLUTION_CLIP_CHARS
_STRICT = re.compile(r"#### \$?(-?[0-9.,]+)")
_NUMBER = re.compile(r"-?[0-9.,]+")


def _value(text: str) -> Decimal | None:
    """``"1,234.50"`` -> 1234.50; None for what is no number (``"."``, ``"1.2.3"``)."""
    text = text.replace(",", "").replace("$", "").rstrip(".")
    try:
        value = Decimal(text)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def _last_number(matches: list[str]) -> Decimal | None:
    for match in reversed(matches):
        value = _value(match)
        if value is not None:
            return value
    return None


def expected_number(row: dict) -> Decimal:
    """The row's answer as a number: the text after its last ``####``, if any."""
    answer = str(reference_answer(row))
    value = _value(answer.rpartition("####")[2].strip())
    if value is None:
        raise ValueError(f"the row's answer {answer[-80:]!r} does not end in a number")
    return value


def _score(answer: Decimal | None, row: dict) -> float:
    return float(answer is not None and answer == expected_number(row))


def gsm8k_reward(completion: str, row: dict) -> dict[str, float]:
    """Strict: ``{"gsm8k": 1.0}`` when the number after the last ``#### `` is the answer."""
    text = completion[-MAX_CHARS:]
    return {"gsm8k": _score(_last_number(_STRICT.findall(text)[-1:]), row)}


def gsm8k_flexible_reward(completion: str, row: dict) -> dict[str, float]:
    """Flexible: ``{"gsm8k_flexible": 1.0}`` when the last number in the text is the answer."""
    text = completion[-MAX_CHARS:]
    return {"gsm8k_flexible": _score(_last_number(_NUMBER.findall(text)), row)}
