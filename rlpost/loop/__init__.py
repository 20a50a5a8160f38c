"""The training loop: the controller's named steps (``controller``), fault
recovery it holds (``recovery``), checkpoints (``checkpoint``), metrics
(``tracking``), signals (``faults``) and the run's result (``result``).

May import: every ``rlpost`` package except ``rlpost.run``, ``rlpost.main``
and ``rlpost.support``.
"""
