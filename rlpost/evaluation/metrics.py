"""Metrics of n sampled completions per prompt, aggregated per prompt and then
averaged over prompts (overall and per ``data_source``). Pure Python and numpy.

- ``pass@k``: the unbiased estimator of Chen et al. 2021 ("Evaluating Large
  Language Models Trained on Code", eq. 1): the chance that k of the n samples,
  drawn without replacement, hold at least one correct one.
- ``mean@n``: the mean score of the n samples (pass@1 when scores are 0 or 1).
- ``greedy``: the score of the temperature-0 completion.
- ``maj@k``: majority voting over the first k samples' answers (``answer_of``).

A sample is *correct* when its score is >= a threshold (``eval.correct_threshold``);
its score is the reward's named ``correctness`` when the reward returns one, else
the total (``judged_scores``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

import numpy as np

if TYPE_CHECKING:
    import torch

    from rlpost.rollout.base import GenerationResult

    # The reward's named scores of every completion, flat (lists or tensors).
    Scores = Mapping[str, Sequence[float] | torch.Tensor]

# \boxed{...} (math answers), with nested braces; and a plain number.
BOXED = "\\boxed{"
NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one prompt with ``c`` correct samples among ``n``.

    Chen et al. 2021, eq. 1: ``pass@k = 1 - C(n - c, k) / C(n, k)``, the chance
    that a draw of k of the n samples without replacement holds a correct one.
    The ratio of binomials is the product ``prod_{i=n-c+1}^{n} (1 - k / i)``,
    computed as such (the binomials themselves overflow for large n); it is 1.0
    when ``n - c < k`` (every draw of k holds a correct sample).
    """
    if not 0 <= c <= n:
        raise ValueError(f"c={c} correct samples: must be between 0 and n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"k={k}: must be between 1 and n={n} (pass@k draws k of the n samples)")
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (nested braces kept), or None."""
    start = text.rfind(BOXED)
    if start < 0:
        return None
    depth, i = 1, start + len(BOXED)
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None  # never closed


def answer_of(completion: str, reward_fn: object = None) -> str | None:
    """The answer a completion gives, for majority voting: the reward function's own
    ``extract_answer(completion)`` when it has that attribute (None: no answer),
    else the last ``\\boxed{...}`` content, else the last number in the text, else
    the stripped completion."""
    extract: Callable[[str], object] | None = getattr(reward_fn, "extract_answer", None)
    if extract is not None:
        found = extract(completion)
        return None if found is None else str(found)
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed
    numbers = NUMBER_RE.findall(completion)
    return numbers[-1] if numbers else completion.strip()


def answer_source(reward: object) -> object:
    """The reward function whose ``extract_answer`` ``answer_of`` uses: ``reward``
    itself, a scorer's function (``.fn``), or of several functions (a list, a
    scorer's ``.fns``) the first that has one; None when none has."""
    if isinstance(reward, list | tuple):
        fns = list(reward)
    else:
        fns = getattr(reward, "fns", None) or [getattr(reward, "fn", reward)]
    return next((f for f in fns if hasattr(f, "extract_answer")), None)


def maj_at_k(answers: Sequence[str | None], correct: Sequence[bool], k: int) -> float:
    """Majority voting over the first ``k`` samples: the answer given most often
    (a tie goes to the answer that came first; samples without an answer do not
    vote) scores the share of its samples that are correct -- 1 or 0 whenever the
    answer alone decides correctness. 0 when no sample of the k gave an answer."""
    if not 1 <= k <= len(answers):
        raise ValueError(f"k={k}: must be between 1 and n={len(answers)}")
    votes: dict[str, list[bool]] = {}
    for answer, ok in zip(answers[:k], correct[:k]):
        if answer is not None:
            votes.setdefault(answer, []).append(ok)
    if not votes:
        return 0.0
    # max keeps the first of equal counts, and dicts keep first-occurrence order.
    winner = max(votes.values(), key=len)
    return sum(winner) / len(winner)


@dataclass(frozen=True)
class PromptSamples:
    """One prompt's samples: their scores and answers (same order), the greedy
    completion's score (None: not sampled) and the row's ``data_source``."""

    scores: Sequence[float]
    answers: Sequence[str | None]
    greedy: float | None = None
    source: str | None = None


def prompt_metrics(p: PromptSamples, ks: Sequence[int], threshold: float) -> dict[str, float]:
    """``mean@n``, ``pass@<k>`` and ``maj@<k>`` for each k, and ``greedy`` (when
    sampled), of one prompt."""
    n = len(p.scores)
    correct = [s >= threshold for s in p.scores]
    out = {"mean@n": float(np.mean(p.scores))}
    for k in ks:
        out[f"pass@{k}"] = pass_at_k(n, sum(correct), k)
    for k in ks:
        out[f"maj@{k}"] = maj_at_k(p.answers, correct, k)
    if p.greedy is not None:
        out["greedy"] = float(p.greedy)
    return out


def _mean_over_prompts(per_prompt: list[dict[str, float]]) -> dict[str, float]:
    keys = [k for k in per_prompt[0]] if per_prompt else []
    out = {k: float(np.mean([m[k] for m in per_prompt if k in m])) for k in keys}
    out["prompts"] = len(per_prompt)
    return out


class Summary(TypedDict):
    """``summarize``'s figures: over every prompt, and over each data source's."""

    overall: dict[str, float]
    per_source: dict[str, dict[str, float]]


def summarize(
    prompts: Sequence[PromptSamples], ks: Sequence[int], threshold: float = 1.0
) -> Summary:
    """Each prompt's metrics (``prompt_metrics``) averaged over prompts.

    Returns ``{"overall": {metric: value, "prompts": count}, "per_source":
    {data_source: {...}}}``; ``per_source`` is empty unless some prompt has a
    source (prompts without one count under ``"unknown"`` there). Every prompt
    weighs the same, whatever its n.
    """
    per_prompt = [prompt_metrics(p, ks, threshold) for p in prompts]
    out: Summary = {"overall": _mean_over_prompts(per_prompt), "per_source": {}}
    if any(p.source is not None for p in prompts):
        groups: dict[str, list[dict[str, float]]] = {}
        for p, m in zip(prompts, per_prompt):
            groups.setdefault(p.source or "unknown", []).append(m)
        out["per_source"] = {s: _mean_over_prompts(ms) for s, ms in sorted(groups.items())}
    return out


def judged_scores(scores: Scores) -> tuple[str, list[float]]:
    """The score each sample is judged by, and its name: the reward's named
    ``correctness`` when it returns one, else ``total``."""
    name = "correctness" if "correctness" in scores else "total"
    return name, [float(s) for s in scores[name]]


def prompt_samples(
    rows: Sequence[dict],
    results: Sequence[GenerationResult],
    scores: Scores,
    reward: object = None,
    greedy: Sequence[float] | None = None,
) -> list[PromptSamples]:
    """``PromptSamples`` of each row from its ``GenerationResult`` (``.completions``,
    each with ``.text``) and the reward's scores of every completion, flat in the
    results' order (``RewardScorer.score``; lists or tensors); ``greedy``: one
    score per row; ``reward``: the reward function(s) or scorer (``answer_source``)."""
    _, flat = judged_scores(scores)
    reward_fn = answer_source(reward)
    out, at = [], 0
    for i, (row, res) in enumerate(zip(rows, results, strict=True)):
        texts = [c.text for c in res.completions]
        source = row.get("data_source") if isinstance(row, dict) else None
        out.append(
            PromptSamples(
                scores=flat[at : at + len(texts)],
                answers=[answer_of(t, reward_fn) for t in texts],
                greedy=None if greedy is None else greedy[i],
                source=None if source is None else str(source),
            )
        )
        at += len(texts)
    if at != len(flat):
        raise ValueError(f"{len(flat)} scores for {at} completions")
    return out


def val_ks(n: int) -> list[int]:
    """The k of ``val/pass@k`` during training: 1, the powers of 2 below n, and n."""
    ks = [1]
    while ks[-1] * 2 < n:
        ks.append(ks[-1] * 2)
    return ks + [n] if n > 1 else ks


def validation_metrics(
    rows: Sequence[dict],
    results: Sequence[GenerationResult],
    scores: Scores,
    n: int,
    threshold: float = 1.0,
    reward: object = None,
) -> dict[str, float]:
    """``trainer.val_n``'s metrics of ``n`` samples per held-out row: ``val/mean@n``,
    ``val/pass@<k>`` for k in ``val_ks(n)``, ``val/maj@<n>`` and, where the rows
    carry a ``data_source``, ``val/<source>/mean@n``."""
    ks = val_ks(n)
    summary = summarize(prompt_samples(rows, results, scores, reward), ks, threshold)
    overall = summary["overall"]
    out = {"val/mean@n": overall["mean@n"]}
    out.update({f"val/pass@{k}": overall[f"pass@{k}"] for k in ks})
    out[f"val/maj@{n}"] = overall[f"maj@{n}"]
    for source, m in summary["per_source"].items():
        out[f"val/{source}/mean@n"] = m["mean@n"]
    return out
