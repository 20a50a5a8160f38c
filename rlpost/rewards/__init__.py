"""Rewards: functions loaded by spec (``loading``), called in isolated worker
processes with a timeout (``pool``) and scored by name (``scoring``).

May import: ``rlpost.config``, ``rlpost.data``.
"""
