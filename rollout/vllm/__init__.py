"""vLLM rollout, in-process: the engine (``engine``), its settings and the vLLM
engine arguments they imply (``config``), its stat loggers (``stats``), vLLM's
outputs as rlpost's results (``outputs``) and the worker extension that loads
new weights (``worker_ext``)."""

from rlpost.rollout.vllm.config import VLLMEngineConfig
from rlpost.rollout.vllm.engine import VLLMEngine

__all__ = ["VLLMEngine", "VLLMEngineConfig"]
