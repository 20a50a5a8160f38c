"""The support matrix: which architectures rlpost trains, verified, as ``SUPPORT.md``.

    python -m rlpost.support                          # every architecture (rlpost.archs)
    python -m rlpost.support Gemma2ForCausalLM ...    # some rows; the others keep theirs
    python -m rlpost.support --render                 # SUPPORT.md from results/support/

Each architecture is built tiny (``rlpost.archs``) and sent through the checks
of ``rlpost.support.checks`` (build, FSDP2, LoRA, a real GRPO run with vLLM
and weight sync, export), each step in its own process so that a crash is
recorded as that check's error, not the end of the run.
"""

from rlpost.support.checks import CHECKS, STEPS, Outcome
from rlpost.support.matrix import check_architecture, render, write_markdown

__all__ = ["CHECKS", "STEPS", "Outcome", "check_architecture", "render", "write_markdown"]
