"""Serving: rollout replicas behind one router (``rollout_group``), the replica
pools a request visits (``pools``), the metrics from the replicas' counters
(``replica_stats``), requests in flight (``pending``) and multi-turn agent
episodes over the group (``agent_episodes``). The engines' configs are derived
from the run config in ``rlpost.plan.engines``.

May import: ``rlpost.config``, ``rlpost.data``, ``rlpost.rewards``,
``rlpost.workers``, ``rlpost.rollout``.
"""
