"""Serving: rollout replicas behind one router (``rollout_group``), requests in
flight (``pending``), the engine config derived from the run config
(``engine_settings``) and multi-turn agent episodes over the group
(``agent_episodes``).

May import: ``rlpost.config``, ``rlpost.data``, ``rlpost.rewards``,
``rlpost.workers``, ``rlpost.rollout``.
"""
