"""The floor beneath the rollout engines and the trainers: what both sides of a
weight sync must agree on. The device each process runs on (``device``), the
layout of a model's checkpoint files (``hf_format``) and the vision-language
import fixes (``vl_compat``), and weights on the wire: rlpost's buckets over a
process group or shared memory (``weight_wire``) and vLLM's own NCCL transfer
(``vllm_transfer``). It imports no other part of rlpost; ``rlpost.trainers``
and ``rlpost.rollout`` stand on it side by side, neither importing the other."""
