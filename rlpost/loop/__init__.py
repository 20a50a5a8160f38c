"""The training loop: the controller's named steps (``controller``), one step's
samples sent and scored (``collect``), fault recovery it holds (``recovery``),
checkpoints (``checkpoint``), metrics (``tracking``, ``step_metrics``), signals
(``faults``), the worker groups by role (``roles``) and ``algo=opd``'s teacher step
(``distill``).

May import: ``rlpost.config``, ``rlpost.data``, ``rlpost.rewards``,
``rlpost.serving``, ``rlpost.workers``, ``rlpost.plan`` (the plan it runs) and
the layers.
"""
