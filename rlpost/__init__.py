"""rlpost: Ray-based RL post-training for LLMs and VLMs.

Notebook use::

    from rlpost import compose, train
    cfg = compose(["algo=grpo", "trainer.total_steps=5"])
    result = train(cfg)  # result.history, result.final_model

The layers below this package -- ``rlpost.algos`` (pure math),
``rlpost.runtime`` (devices, checkpoint layouts, weights on the wire), and
``rlpost.trainers`` and ``rlpost.rollout`` (engines, no Ray) -- live in the
folders ``algos/``, ``runtime/``, ``trainers/`` and ``rollout/`` at the top of
the repository; an installed rlpost holds them inside this package.
"""

from pathlib import Path as _Path

_LAYERS = ("algos", "rollout", "runtime", "trainers")
_source_root = _Path(__file__).resolve().parent.parent
if not (_Path(__file__).parent / "algos").is_dir() and all(
    (_source_root / layer / "__init__.py").is_file() for layer in _LAYERS
):
    # A checkout used without installing (e.g. a Ray job's copied working
    # directory): find ``rlpost.<layer>`` in the folders beside this package.
    __path__.append(str(_source_root))  # noqa: F821

from rlpost.config import Config, compose  # noqa: E402


def train(cfg: Config):
    """Run training; returns a ``RunResult`` (run_dir, history, final_model)."""
    from rlpost.run import train as _train

    return _train(cfg)


__all__ = ["Config", "compose", "train"]
