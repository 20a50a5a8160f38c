"""rlpost: Ray-based RL post-training for LLMs and VLMs.

Notebook use::

    from rlpost import compose, train
    cfg = compose(["algo=grpo", "trainer.total_steps=5"])
    result = train(cfg)  # result.history, result.final_model
"""

from rlpost.config import Config, compose


def train(cfg: Config):
    """Run training; returns a ``RunResult`` (run_dir, history, final_model)."""
    from rlpost.run import train as _train

    return _train(cfg)


__all__ = ["Config", "compose", "train"]
