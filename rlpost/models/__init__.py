"""Models: the built-in tiny models and their warm-up (``tiny``, ``warmup``),
the architecture table (``archs``) and the vision-language models and their
processor inputs (``vl``, ``vl_inputs``).

May import: ``rlpost.config``, ``rlpost.data``, ``rlpost.trainers``.
"""
