"""A generative judge: ``reward.judge.path``.

A causal LM, served by a rollout engine of its own, reads each sample through
``reward.judge.template`` -- a prompt with ``{prompt}``, ``{completion}`` and
``{answer}`` fields (any other ``{column}`` of the row too; ``{{`` and ``}}`` are
literal braces) -- and writes a verdict; ``reward.judge.parse`` turns the
verdict into a score:

- a regular expression: the score is its first group (or the whole match when
  it has none) as a number, at the verdict's first match;
- a function, ``file.py:fn`` or ``module:fn``: ``fn(verdict) -> float | None``.

A verdict that does not parse (no match, not a number, the function returning
None or raising) is an error: scored 0 and counted (``reward/<name>/errors``),
and a step where more than ``reward.max_error_frac`` of the verdicts fail stops
the run, as for a reward function.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from rlpost.data.columns import fill_template, template_fields
from rlpost.rewards.loading import RewardError, load_reward_fn

if TYPE_CHECKING:
    from rlpost.rewards.scoring import SampleExtras

log = logging.getLogger(__name__)

FUNCTION_SPEC = re.compile(r"^(\S+\.py|[A-Za-z_][\w.]*):[A-Za-z_]\w*$")
SAMPLE_FIELDS = ("prompt", "completion", "answer")


def build_parser(spec: str) -> Callable[[str], object]:
    """``reward.judge.parse`` as a function of the verdict (see the module
    docstring; a user's function may return anything, which ``JudgeReward`` checks);
    a bad regex or function spec is a :class:`RewardError`."""
    if FUNCTION_SPEC.match(spec):
        fn = load_reward_fn(spec)
        return lambda verdict: fn(verdict)
    try:
        pattern = re.compile(spec)
    except re.error as exc:
        raise RewardError(
            f"reward.judge.parse={spec!r} is neither file.py:function nor a regular expression "
            f"({exc}); e.g. reward.judge.parse='Score: (\\d+)'"
        ) from exc
    if pattern.groups > 1:
        raise RewardError(
            f"reward.judge.parse={spec!r} has {pattern.groups} groups; give it one, the score "
            "(use (?:...) for the others)"
        )

    def parse(verdict: str) -> float | None:
        match = pattern.search(verdict)
        if match is None:
            return None
        return float(match.group(1) if pattern.groups else match.group(0))

    return parse


def check_template(template: str, columns: set[str]) -> list[str]:
    """A template field that is neither a sample's nor a column of the rows."""
    unknown = [f for f in template_fields(template) if f not in {*SAMPLE_FIELDS, *columns}]
    if not unknown:
        return []
    return [
        f"reward.judge.template names {unknown}, which the rows lack (columns: "
        f"{sorted(columns)}); use {{prompt}}, {{completion}}, {{answer}} or a column"
    ]


def prompt_text(prompt: str | list[dict] | None) -> str:
    """A row's prompt as the judge reads it: the text, or the chat's last user turn."""
    if isinstance(prompt, str):
        return prompt
    users = [m.get("content") for m in prompt or [] if m.get("role") == "user"]
    last = users[-1] if users else ""
    return last if isinstance(last, str) else str(last)


class JudgeReward:
    """The judge's verdicts as one named reward of a ``RewardSet``.

    ``generate`` sends the judge's prompts (token ids) and returns its verdict
    texts in order: the judge's rollout group, or in a test a scripted stand-in.
    """

    def __init__(
        self,
        name: str,
        template: str,
        parse: Callable[[str], object],
        encode: Callable[[str], list[int]],
        generate: Callable[[list[list[int]]], list[str]],
        max_error_frac: float,
    ):
        self.name, self.template, self.parse = name, template, parse
        self.encode, self.generate, self.max_error_frac = encode, generate, max_error_frac
        self.weights: dict[str, float] = {}
        self._warned = False

    def score(
        self,
        completions: list[str],
        rows: list[dict],
        extras: list[SampleExtras] | None = None,
    ) -> tuple[dict[str, list[float]], dict[str, float]]:
        prompts = [
            fill_template(
                self.template,
                {**row, "prompt": prompt_text(row.get("prompt")), "completion": text,
                 "answer": row.get("answer", "")},
            )
            for text, row in zip(completions, rows)
        ]  # fmt: skip
        verdicts = self.generate([self.encode(p) for p in prompts])
        values, failed = [], []
        for verdict in verdicts:
            try:
                value = self.parse(verdict)
            except Exception:  # a user's parse function: counted like a failed call
                value = None
            if value is None or not isinstance(value, int | float) or not math.isfinite(value):
                failed.append(verdict)
                values.append(0.0)
            else:
                values.append(float(value))
        if failed and not self._warned:
            self._warned = True
            log.warning(
                "reward.judge (%s): %d of %d verdicts did not parse, scored 0; first: %r "
                "(logged once)", self.name, len(failed), len(verdicts), failed[0][:200],
            )  # fmt: skip
        if verdicts and len(failed) > self.max_error_frac * len(verdicts):
            raise RewardError(
                f"reward.judge ({self.name}): {len(failed)} of {len(verdicts)} verdicts did not "
                f"parse, more than reward.max_error_frac={self.max_error_frac:g}; fix "
                f"reward.judge.parse or reward.judge.template. First verdict: {failed[0][:300]!r}"
            )
        metrics = {"reward/errors": float(len(failed)), "reward/timeouts": 0.0}
        return {"total": values, self.name: values}, metrics

    def close(self) -> None:
        pass
