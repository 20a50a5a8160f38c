"""Megatron-core training backend (``trainer=megatron``): tensor and pipeline parallelism.

``convert`` (HF <-> Megatron weights) is plain torch; ``engine`` and ``cpu_shim``
import megatron-core (the ``megatron`` extra).
"""
