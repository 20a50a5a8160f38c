"""``python -m rlpost.export``: a checkpoint (LoRA or full) becomes an HF model that
transformers and real vLLM load and that reproduces the trainer."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from engine_utils import DEVICES, advantages, engine, free_port, hf_logprobs, make_batch, spawn

from rlpost.algos import PolicyLossConfig
from rlpost.loop.checkpoint import CheckpointManager
from rlpost.models.tiny import build_tiny_model
from rlpost.runtime.vl_compat import torchvision_available
from rlpost.trainers.fsdp.lora import LoraSettings

VARIANTS = {"full": {}, "lora": {"lora": LoraSettings(rank=8, alpha=16.0)}}


def _train_and_save(
    rank: int, model_dir: str, port: int, variant: str, run_dir: str, out: str, device: str
):
    eng = engine(model_dir, rank, 1, port, device, lr=5e-2, micro_batch_size=8, **VARIANTS[variant])
    batch = make_batch()
    batch.advantages_bt = advantages(batch)
    for _ in range(3):
        batch.old_logp_bt = eng.logprobs(batch)
        eng.update_policy(batch, PolicyLossConfig())
    manager = CheckpointManager(run_dir, keep_last=1)
    manager.atomic_write(3, lambda tmp: eng.save_checkpoint(str(tmp / "policy")))
    torch.save({"logp": eng.logprobs(make_batch(seed=5))}, out)
    eng.close()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(build_tiny_model("micro", tmp_path_factory.mktemp("exp") / "m", 0, init_std=0.3))


def _export(
    model_dir: str, tmp: Path, variant: str, device: str = "cpu"
) -> tuple[Path, torch.Tensor]:
    run_dir = tmp / "run"
    args = (model_dir, free_port(), variant, str(run_dir), str(tmp / "t.pt"), device)
    spawn(_train_and_save, args)
    step = CheckpointManager(run_dir, 1).latest()
    assert step is not None
    out = tmp / "hf"
    cmd = [sys.executable, "-m", "rlpost.export", str(step), str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return out, torch.load(tmp / "t.pt")["logp"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_export_loads_in_transformers_and_matches_the_trainer(variant, device, model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, trainer_logp = _export(model_dir, tmp_path, variant, device)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    # plain HF names: no peft prefixes, no adapter tensors
    assert not any("lora" in k or "base_layer" in k for k in model.state_dict())
    batch = make_batch(seed=5)
    # merged, W + (alpha/r) B A is rounded to fp32 once; the trainer adds the two
    # branches' outputs instead: log-probs of ~-5 then differ by a few 1e-6 relative
    torch.testing.assert_close(hf_logprobs(model, batch), trainer_logp, rtol=0, atol=1e-4)
    base = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    assert (hf_logprobs(base, batch) - trainer_logp).abs().max() > 1e-2  # it trained
    assert AutoTokenizer.from_pretrained(out).eos_token == "<|end|>"


def _export_cli(checkpoint: Path, out: Path) -> subprocess.CompletedProcess:
    """``python -m rlpost.export CHECKPOINT OUT``'s exit code and output, its ``main``
    run in this process (what the command prints before its exit is all ``main``'s)."""
    from rlpost.export import main

    argv = [str(checkpoint), str(out)]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(argv)
    return subprocess.CompletedProcess(argv, code, stdout.getvalue(), stderr.getvalue())


def test_export_cli_says_a_missing_path_does_not_exist(tmp_path):
    proc = _export_cli(tmp_path / "nope", tmp_path / "o")
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {tmp_path / 'nope'} does not exist"


@pytest.mark.parametrize("given", ["run", "run/checkpoints"])
def test_export_cli_lists_a_run_directorys_checkpoints_to_pass(given, tmp_path):
    """A run directory, or its checkpoints/ folder, is not exported: the error lists the
    complete checkpoints (an interrupted save's .partial is not one) and names the
    latest, and points at final/ (the run's HF model)."""
    root = tmp_path / "run" / "checkpoints"
    for name in ("step_000002", "step_000004"):
        (root / name).mkdir(parents=True)
        (root / name / "COMPLETE").write_text(name[-1])
    (root / "step_000006.partial").mkdir()
    (tmp_path / "run" / "final").mkdir()
    proc = _export_cli(tmp_path / given, tmp_path / "o")
    assert proc.returncode == 2 and not (tmp_path / "o").exists()
    what = "a run directory" if given == "run" else "a run's checkpoints folder"
    assert proc.stderr.splitlines() == [
        f"error: {tmp_path / given} is {what}, not a checkpoint; pass one of its checkpoints "
        "(oldest first):",
        f"  {root / 'step_000002'}",
        f"  {root / 'step_000004'}",
        f"the latest: python -m rlpost.export {root / 'step_000004'} OUT_DIR",
        f"({tmp_path / 'run' / 'final'} is the run's last policy, already an HF model directory)",
    ]


def test_export_cli_says_a_run_without_checkpoints_has_none(tmp_path):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    proc = _export_cli(tmp_path / "run", tmp_path / "o")
    assert proc.returncode == 2
    assert "is a run directory, not a checkpoint; it has no complete checkpoint" in proc.stderr


def test_export_help_says_what_a_vl_processor_needs_without_torchvision():
    cmd = [sys.executable, "-m", "rlpost.export", "--help"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    assert "from rlpost.runtime.vl_compat import install; install()" in proc.stdout
    assert "Megatron" in proc.stdout


def test_exported_lora_model_generates_in_vllm_like_transformers(model_dir, tmp_path):
    pytest.importorskip("vllm")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlpost.rollout.base import GenerationRequest, SamplingConfig
    from rlpost.rollout.vllm import VLLMEngine, VLLMEngineConfig

    out, _ = _export(model_dir, tmp_path, "lora")
    tokenizer = AutoTokenizer.from_pretrained(out)
    prompts = [tokenizer.encode(p) for p in ("12+7=", "hello", "99+1=")]
    threads = torch.get_num_threads()
    llm = VLLMEngine(VLLMEngineConfig(model_path=str(out), kv_cache_gib=0.0625))
    torch.set_num_threads(threads)
    greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=8)
    results = llm.generate([GenerationRequest(p, greedy) for p in prompts])
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    for prompt, res in zip(prompts, results):
        ids = model.generate(
            torch.tensor([prompt]), max_new_tokens=8, do_sample=False, eos_token_id=None
        )[0, len(prompt) :].tolist()
        got = res.completions[0].token_ids
        assert got == ids[: len(got)] and len(got) >= 1


def _save_vl_checkpoint(rank: int, model_dir: str, port: int, run_dir: str):
    eng = engine(model_dir, rank, 1, port)
    manager = CheckpointManager(run_dir, keep_last=1)
    manager.atomic_write(1, lambda tmp: eng.save_checkpoint(str(tmp / "policy")))
    eng.close()


def test_an_exported_llava_names_its_vision_tower_as_vllm_loads_it(tmp_path):
    """A LLaVA directory as transformers 5 writes a model it built from a config
    (``vision_tower.embeddings.*``, which vLLM refuses) trains, and its export has
    the hub names (``vision_tower.vision_model.*``), the same weights and the
    processor."""
    from safetensors import safe_open
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    from rlpost.models.vl import VL_ARCHS
    from rlpost.runtime.vl_compat import install

    install()
    tok, config, processor = VL_ARCHS["LlavaForConditionalGeneration"]()
    source = tmp_path / "llava"
    LlavaForConditionalGeneration(config).save_pretrained(source)
    processor.save_pretrained(source)
    tok.save_pretrained(source)
    run_dir = tmp_path / "run"
    spawn(_save_vl_checkpoint, (str(source), free_port(), str(run_dir)))
    step = CheckpointManager(run_dir, 1).latest()
    out = tmp_path / "hf"
    cmd = [sys.executable, "-m", "rlpost.export", str(step), str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr

    def tower(path: Path) -> list[str]:
        with safe_open(str(path / "model.safetensors"), "pt") as f:
            return sorted(k for k in f.keys() if k.startswith("vision_tower."))  # noqa: SIM118

    assert tower(source) and all(".vision_model." not in k for k in tower(source))
    assert tower(out) == sorted(
        k.replace("tower.", "tower.vision_model.", 1) for k in tower(source)
    )
    before = LlavaForConditionalGeneration.from_pretrained(source).state_dict()
    after = LlavaForConditionalGeneration.from_pretrained(out).state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert AutoProcessor.from_pretrained(out).image_token == "<image>"
    # plain transformers (no rlpost, no torchvision layer) loads the exported processor
    plain = "import sys, transformers; transformers.AutoProcessor.from_pretrained(sys.argv[1])"
    loaded = subprocess.run([sys.executable, "-c", plain, str(out)], capture_output=True, text=True)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert "note:" not in proc.stderr  # nothing to call first


@pytest.mark.skipif(torchvision_available(), reason="transformers builds it with torchvision")
def test_an_exported_qwen2_vl_says_what_its_processor_needs_without_torchvision(tmp_path):
    """Qwen2-VL's processor declares a video processor, which transformers builds only
    with torchvision: the export says which call makes AutoProcessor load it."""
    from rlpost.models.vl import build_vl_model

    source = build_vl_model("Qwen2VLForConditionalGeneration", tmp_path / "vl", seed=0)
    run_dir = tmp_path / "run"
    spawn(_save_vl_checkpoint, (str(source), free_port(), str(run_dir)))
    step = CheckpointManager(run_dir, 1).latest()
    out = tmp_path / "hf"
    proc = subprocess.run(
        [sys.executable, "-m", "rlpost.export", str(step), str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(out)
    note = proc.stderr.strip().splitlines()[-1]
    assert note.startswith("note: torchvision is not installed")
    assert "`from rlpost.runtime.vl_compat import install; install()`" in note
    assert f"AutoProcessor.from_pretrained('{out}')" in note
