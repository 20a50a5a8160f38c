"""Evaluation: metrics of n samples per prompt -- pass@k, mean@n, greedy accuracy,
maj@k -- (``metrics``, pure Python) and the ``python -m rlpost.eval`` command that
samples a trained model on the held-out prompts and writes them (``run``).

May import: ``rlpost.config``, ``rlpost.data``, ``rlpost.rewards``, ``rlpost.plan``,
``rlpost.serving``, ``rlpost.workers`` and the layers; the loop imports
``metrics`` for ``trainer.val_n``, not the other way round.
"""
