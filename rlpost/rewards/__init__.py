"""Rewards: functions loaded by spec (``loading``), called in isolated worker
processes with a timeout (``pool``), scored by name (``scoring``) and several
summed into one total (``combine``); built-in verifiers for common data
(``verifiers``: math, gsm8k, think_format, code).

May import: ``rlpost.config``, ``rlpost.data``, ``rlpost.rollout`` (the sandbox,
for ``code``).
"""
