"""The support matrix's bookkeeping: judging a CLI run, errors, SUPPORT.md rendering.

The checks themselves run in tests/integration/test_model_matrix.py.
"""

from __future__ import annotations

import json

from rlpost.rollout.vllm.config import cpu_custom_ops
from rlpost.support.common import CHECKS, architectures, cli_error
from rlpost.support.grpo_run import judge_run
from rlpost.support.report import GPU_CHECKS, render
from rlpost.support.runner import save_record

RAY_SYNC_ERROR = """\
Traceback (most recent call last):
ray.exceptions.RayTaskError(ValueError): \x1b[36mray::RolloutWorker.load_weights()\x1b[39m (pid=1)
    raise ValueError(
ValueError: weight sync left 4 rollout parameter(s) unwritten
"""


def _row(step: int, gap: float, loss: float = 0.1) -> dict:
    return {"step": step, "rollout/logprob_abs_diff_max": gap, "actor/pg_loss": loss,
            "actor/grad_norm": 2.0}  # fmt: skip


def test_a_clean_run_passes_vllm_sync_and_grpo():
    rows = [{"step": 0, "val/accuracy": 0.5}, _row(1, 1e-5), _row(2, 2e-5)]
    out = judge_run(0, "done", rows, weight_change=2e-3)
    assert {k: v.status for k, v in out.items()} == {"vllm": "pass", "sync": "pass", "grpo": "pass"}
    assert "1.0e-05" in out["vllm"].text and "2.0e-05" in out["sync"].text


def test_a_gap_after_the_sync_fails_only_the_sync_check():
    rows = [{"step": 0}, _row(1, 9e-6), _row(2, 0.077)]
    out = judge_run(0, "done", rows, weight_change=1e-3)
    assert out["vllm"].status == "pass" and out["grpo"].status == "pass"
    assert out["sync"].status == "fail" and "0.077 after a sync" in out["sync"].text


def test_a_gap_before_any_sync_is_the_engine_s_fault():
    rows = [{"step": 0}, _row(1, 4.7), _row(2, 4.9)]
    out = judge_run(0, "done", rows, weight_change=1e-3)
    assert out["vllm"].status == "fail" and "4.7 before any sync" in out["vllm"].text


def test_a_run_dying_in_the_sync_blames_the_sync_and_skips_what_it_stopped():
    out = judge_run(1, RAY_SYNC_ERROR, [{"step": 0}], weight_change=None)
    assert out["vllm"].status == "pass"  # step 0's validation generated
    assert out["sync"].status == "fail"
    assert out["sync"].text == "ValueError: weight sync left 4 rollout parameter(s) unwritten"
    assert out["grpo"].status == "skip" and "sync" in out["grpo"].text


def test_weights_that_did_not_move_fail_grpo():
    rows = [{"step": 0}, _row(1, 1e-6), _row(2, 1e-6)]
    assert judge_run(0, "", rows, weight_change=0.0)["grpo"].status == "fail"


def test_cli_error_prefers_rlpost_s_own_error_line():
    output = "INFO starting\nValueError: inner\nerror: step 2: the gap is 8.4\n"
    assert cli_error(output) == "step 2: the gap is 8.4"
    assert cli_error(RAY_SYNC_ERROR).startswith("ValueError: weight sync left")


def test_deepseek_on_cpu_turns_off_vllm_s_rotary_op_and_nothing_else_does():
    assert cpu_custom_ops("deepseek_v2") == ["all", "-rotary_embedding"]
    assert cpu_custom_ops("deepseek_v3") == ["all", "-rotary_embedding"]
    assert cpu_custom_ops("qwen3_moe") is None and cpu_custom_ops(None) is None


def test_support_md_has_a_row_per_architecture_and_empty_gpu_columns(tmp_path):
    ok = {"status": "pass", "text": "fine", "seconds": 1.0}
    long_error = "ValueError: " + "x" * 200
    checks = {c: dict(ok) for c in CHECKS}
    checks["sync"] = {"status": "fail", "text": long_error, "seconds": 1.0}
    checks["grpo"] = {"status": "skip", "text": "not reached", "seconds": 1.0}
    save_record("Qwen3MoeForCausalLM", "cpu", checks, 60.0, tmp_path)
    text = render(tmp_path)
    table = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(table) == 1 + len(architectures())  # header + one row each
    assert any(line.startswith("| LlavaForConditionalGeneration |") for line in table)
    assert len(table[0].split("|")) - 2 == 1 + len(CHECKS) + len(GPU_CHECKS)
    (row,) = [line for line in table if line.startswith("| Qwen3MoeForCausalLM |")]
    cells = [c.strip() for c in row.split("|")[2:-1]]
    assert cells[: len(CHECKS)] == ["✓", "✓", "✓", "✓", cells[4], "–", "✓"]
    assert cells[4].startswith("✗ ValueError: xxx") and cells[4].endswith("…")
    assert cells[len(CHECKS) :] == [""] * len(GPU_CHECKS)  # no GPU run yet
    assert long_error in text  # whole, under Failures
    assert "python -m rlpost.support" in text and "GPU: not run yet." in text
    record = json.loads((tmp_path / "cpu" / "Qwen3MoeForCausalLM.json").read_text())
    assert {"torch", "transformers", "vllm"} <= record["versions"].keys()
    # An architecture without results has an empty row.
    (empty,) = [line for line in table if line.startswith("| LlamaForCausalLM |")]
    assert {c.strip() for c in empty.split("|")[2:-1]} == {""}


def test_a_run_failing_to_write_its_final_model_keeps_its_step_checks():
    output = (
        "ray.exceptions.RayTaskError(NotImplementedError): ray::TrainerWorker.call()\n"
        '  File "trainers/fsdp/engine.py", line 404, in save_hf\n'
        "NotImplementedError: Cannot copy out of meta tensor; no data!\n"
    )
    rows = [{"step": 0}, _row(1, 1e-6), _row(2, 2e-6)]
    out = judge_run(1, output, rows, weight_change=None)
    assert {k: v.status for k, v in out.items()} == {"vllm": "pass", "sync": "pass", "grpo": "pass"}
    assert "no final model" in out["grpo"].text


def test_the_support_command_leaves_the_checkouts_files_alone_by_default(tmp_path, monkeypatch):
    from rlpost.support.__main__ import main
    from rlpost.support.report import MARKDOWN

    before = MARKDOWN.read_text()
    monkeypatch.chdir(tmp_path)
    assert main(["--render"]) == 0
    assert (tmp_path / "outputs" / "support" / "SUPPORT.md").is_file()
    assert MARKDOWN.read_text() == before
