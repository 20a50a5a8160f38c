"""Megatron-core training backend (``trainer=megatron``): tensor, pipeline and expert
parallelism.

``convert`` (HF <-> Megatron weights) and ``config`` are plain torch; ``model``
(one rank's GPT model and optimizer), ``schedule``, ``checkpoint``, ``engine``
(the policy), ``critic`` (PPO's value model) and ``cpu_shim`` import
megatron-core (the ``megatron`` extra).
"""
