"""An environment in the shape of TRL's ``environment_factory``, trained by rlpost as is:

    python -m rlpost.main algo=grpo data=files data.train_files=counter.jsonl \\
        data.val_files=counter.jsonl agent.env=examples/agents/trl_style_env.py:CounterEnv

One instance per episode. ``reset`` gets the row's ``target`` column; the public
method ``increment`` is the model's tool; the episode's reward is ``reward`` when
the model answers without a tool call. Rows: ``{"prompt": "Count to 3.", "target": 3}``.
"""


class CounterEnv:
    def __init__(self):
        self.count = 0
        self.target = 0
        self.reward = 0.0

    def reset(self, target: int = 0) -> str | None:
        self.count, self.target, self.reward = 0, int(target), 0.0
        return "The counter starts at 0."

    def increment(self, by: int) -> int:
        """Add to the counter.

        Args:
            by: How much to add.

        Returns:
            The counter's new value.
        """
        self.count += by
        self.reward = 1.0 if self.count == self.target else 0.0
        return self.count
