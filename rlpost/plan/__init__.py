"""The run plan: everything a config implies -- device, model checks, data,
reward, agent, the algorithm's settings and every engine's config -- resolved
and checked once, before Ray starts (``plan``); then the workers started from
it (``launch``).

May import: every ``rlpost`` package except ``rlpost.run``, ``rlpost.main``
and ``rlpost.support``.
"""
