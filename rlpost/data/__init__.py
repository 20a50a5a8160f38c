"""Prompts and samples: data files and their validation (``rows``), the
built-in tasks (``tasks``), images (``images``), and turning rows and
generations into trajectory batches (``samples``).

May import: ``rlpost.config``, ``rlpost.rollout.base``, ``rlpost.trainers.batch``.
"""
