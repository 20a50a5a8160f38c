"""SGLang rollout (CUDA only): an in-actor engine, and prefill/decode servers behind SGLang's router.

Targets ``sglang==0.5.23`` and ``sglang-router==0.3.2`` (the ``sglang`` extra).
"""

from rlpost.rollout.sglang.engine import SGLangEngine, SGLangEngineConfig
from rlpost.rollout.sglang.pd import SGLangPDConfig, SGLangPDEngine

__all__ = ["SGLangEngine", "SGLangEngineConfig", "SGLangPDConfig", "SGLangPDEngine"]
