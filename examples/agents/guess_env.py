"""A custom environment: guess a secret digit, with "higher" / "lower" hints.

Train on it with your own data (rows with a "prompt" and a "secret" digit):

    python -m rlpost.main algo=grpo data=files \
        data.train_files=guess_train.jsonl data.val_files=guess_val.jsonl \
        agent.env=examples/agents/guess_env.py:GuessEnv agent.env_kwargs.max_guesses=4

rlpost makes one instance per episode with ``agent.env_kwargs``. ``reset`` opens
the episode; ``step`` gets each assistant message and answers with new messages,
whether the episode is over, and a reward (or None to let ``reward.fn`` score it).
"""

from __future__ import annotations


class GuessEnv:
    def __init__(self, max_guesses: int = 4):
        self.max_guesses = max_guesses

    def reset(self, row: dict) -> list[dict]:
        self.secret = int(row["secret"])
        self.guesses = 0
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, message: dict) -> tuple[list[dict], bool, float | None]:
        self.guesses += 1
        text = message["content"].strip()
        if not (len(text) == 1 and text.isdigit()):
            reply, reward = "Answer with one digit.", 0.0
        elif int(text) == self.secret:
            return [], True, 1.0 - 0.2 * (self.guesses - 1)  # fewer guesses, more reward
        else:
            reply, reward = ("higher" if int(text) < self.secret else "lower"), 0.0
        done = self.guesses >= self.max_guesses
        return [{"role": "user", "content": reply}], done, reward
