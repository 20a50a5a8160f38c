"""The run plan: everything a config implies -- device, model checks, data,
reward, agent, the algorithm's settings and every engine's config -- resolved
and checked once, before Ray starts (``plan``, ``checks``, ``inputs``,
``algo``, ``engines``, ``teacher``). ``rlpost.launch`` starts the workers from it.

May import: ``rlpost.config``, ``rlpost.data``, ``rlpost.rewards``,
``rlpost.models``, ``rlpost.workers`` and the layers; the loop and serving
packages import it, not the other way round.
"""
