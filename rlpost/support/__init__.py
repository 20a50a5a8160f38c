"""The support matrix: which architectures rlpost trains, verified, as ``SUPPORT.md``.

    python -m rlpost.support                          # every architecture -> outputs/support/
    python -m rlpost.support Gemma2ForCausalLM ...    # some rows; the others keep theirs
    python -m rlpost.support --in-repo                # the checkout's SUPPORT.md and results/support/
    python -m rlpost.support --render --in-repo       # SUPPORT.md from results/support/

Each architecture is built tiny (``rlpost.models.archs``; vision-language ones by
``rlpost.models.vl``, with an image in every prompt: ``vl``) and sent through
the checks: build, FSDP2, LoRA (``checks``), a real GRPO run with vLLM and
weight sync (``grpo_run``) and the export (``checks``), each step in a process
of its own (``runner``) so that a crash is recorded as that check's error, not
the end of the run; ``report`` renders the stored results.
"""

from rlpost.support.common import CHECKS, STEPS, Outcome
from rlpost.support.report import render, write_markdown
from rlpost.support.runner import check_architecture

__all__ = ["CHECKS", "STEPS", "Outcome", "check_architecture", "render", "write_markdown"]
