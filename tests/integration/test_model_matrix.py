"""The model matrix: each architecture of ``rlpost.archs`` through the checks of
``rlpost.support`` (the same code that writes SUPPORT.md), asserting every one passes.

The whole matrix (all checks, every architecture, about 13 minutes on two
cores) is deselected by default; run it with

    .venv/bin/python -m pytest -m matrix tests/integration/test_model_matrix.py

CI runs two architectures through a real GRPO run (build, vLLM generation,
weight sync parity, GRPO steps): Qwen3-MoE, whose experts transformers keeps
fused in memory while checkpoints and vLLM hold them per expert (a sync that
misnames them leaves the rollout on stale weights), and Gemma 2, whose
sliding window is shorter than prompt plus completion.
"""

from __future__ import annotations

import pytest

pytest.importorskip("ray")
pytest.importorskip("vllm")

from rlpost.archs import ARCHS  # noqa: E402
from rlpost.support import check_architecture  # noqa: E402

CI_ARCHS = ("Qwen3MoeForCausalLM", "Gemma2ForCausalLM")


def assert_all_pass(arch: str, results: dict[str, dict]) -> None:
    failures = {
        k: f"{v['status']}: {v['text']}" for k, v in results.items() if v["status"] != "pass"
    }
    assert not failures, f"{arch}: {failures}"


@pytest.mark.parametrize("arch", CI_ARCHS)
def test_grpo_run_samples_from_the_synced_policy(arch, tmp_path):
    results = check_architecture(arch, tmp_path, steps=("build", "run"))
    assert set(results) == {"build", "vllm", "sync", "grpo"}
    assert_all_pass(arch, results)


@pytest.mark.matrix
@pytest.mark.parametrize("arch", list(ARCHS))
def test_every_support_check_passes(arch, tmp_path):
    results = check_architecture(arch, tmp_path)
    assert set(results) == {"build", "fsdp", "lora", "vllm", "sync", "grpo", "export"}
    assert_all_pass(arch, results)
