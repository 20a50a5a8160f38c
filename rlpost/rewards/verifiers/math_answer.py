r"""``reward.fn=math``: is the completion's final answer equal to the row's, as mathematics?

The final answer is the content of the LAST ``\boxed{...}`` (or ``\fbox{...}``)
in the completion, braces balanced, so a completion that boxes several
answers is judged by its last. A completion with no box answers with the
last number or expression in its text; one whose last box never closes (cut
off mid-answer) has no answer. Equivalence is math-verify's (parsed into
sympy): ``\frac{1}{2}`` equals ``0.5`` and ``2\sqrt{2}`` equals ``\sqrt{8}``.

Only the last ``MAX_CHARS`` characters of a completion are read, so a huge
completion costs no more than a short one; a completion with no answer
scores 0 and never raises.
"""

from __future__ import annotations

import re
import threading
from types import ModuleType

from rlpost.rewards.verifiers.columns import reference_answer, without_special_tokens

MAX_CHARS = 4000  # the tail of the completion that is read
TIMEOUT_S = 5  # math-verify's own limit per parse / comparison (main thread only)
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")


def last_boxed(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}`` / ``\fbox{...}`` in ``text``; None
    when there is none or the last one never closes."""
    openings = list(_BOX.finditer(text))
    if not openings:
        return None
    start = openings[-1].end()
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None


def _math_verify() -> ModuleType:
    try:
        import math_verify
    except ImportError as e:
        raise ImportError("reward.fn=math needs math-verify: pip install 'rlpost[math]'") from e
    return math_verify


def math_reward(completion: str, row: dict) -> dict[str, float]:
    r"""``{"math": 1.0}`` when the completion's final answer (see the module
    docstring) is mathematically equal to the row's answer, else 0.0.

    The answer is the row's ``answer``, ``ground_truth`` or
    ``reward_model["ground_truth"]``, as LaTeX or plain text (``\frac{1}{2}``,
    ``0.5``, ``x^2+1``).
    """
    mv = _math_verify()
    gold_text = str(reference_answer(row)).strip()
    text = without_special_tokens(completion)[-MAX_CHARS:]
    boxed = last_boxed(text)
    if boxed is None and _BOX.search(text):
        return {"math": 0.0}  # the last box never closes: no answer
    if boxed is not None and boxed.strip() == gold_text:
        return {"math": 1.0}
    # math-verify's timeouts use SIGALRM, which only the main thread can set;
    # elsewhere the reward worker's reward.timeout_s is the bound.
    seconds = TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    config = [mv.LatexExtractionConfig(), mv.ExprExtractionConfig()]
    gold = mv.parse(f"\\boxed{{{gold_text}}}", config, parsing_timeout=seconds)
    if boxed is not None:
        predicted = mv.parse(f"\\boxed{{{boxed}}}", config, parsing_timeout=seconds)
    else:
        predicted = mv.parse(text, config, parsing_timeout=seconds)
    if not gold or not predicted:
        return {"math": 0.0}
    return {"math": float(mv.verify(gold, predicted, timeout_seconds=seconds))}
