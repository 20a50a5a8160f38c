"""The Ray side of the workers: thin actor shells that each hold one engine
(``rollout_worker``, ``trainer_worker`` with its ``TrainerGroup``) and the
placement groups that say where they run (``placement``).

May import: ``rlpost.config``, ``rlpost.rollout``, ``rlpost.trainers``, ray.
"""
