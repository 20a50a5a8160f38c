"""An example reward for the string-reversal data of ``make_dataset.py``.

Use it with ``reward=custom reward.fn=examples/custom_reward.py:score``.

rlpost calls ``score(completion, row)`` once per sample, where ``completion``
is the generated text (without the prompt) and ``row`` is the dataset row the
prompt came from, with all its extra fields (here ``answer``). Returning a
dict gives several named rewards: each is logged as ``reward/<name>`` and the
advantage uses their weighted sum. The weights come from ``reward.weights`` on
the command line, or else from the function's ``default_weights`` attribute,
or else 1.0 each.

A reward that raises scores 0 for that sample, is counted in
``reward/errors`` and is logged once per distinct message; the run goes on.
"""

from __future__ import annotations


def score(completion: str, row: dict) -> dict[str, float]:
    """Named rewards of one completion.

    - ``correctness``: 1.0 when the stripped completion equals ``row["answer"]``.
      The name matters: validation reports a reward named ``correctness`` as
      ``val/accuracy``; without one it reports only ``val/reward_mean``.
    - ``length_penalty``: in [-1, 0], minus the relative length error, so a
      completion of the right length is not penalised. It gives a signal
      before the model gets any answer exactly right.
    """
    answer = row["answer"]
    text = completion.strip()
    correctness = float(text == answer)
    length_error = abs(len(text) - len(answer)) / max(len(answer), 1)
    return {"correctness": correctness, "length_penalty": 0.0 - min(length_error, 1.0)}


# Used when reward.weights is not set: correctness dominates, the length term
# only breaks ties between wrong answers.
score.default_weights = {"correctness": 1.0, "length_penalty": 0.1}  # type: ignore[attr-defined]
