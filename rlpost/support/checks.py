"""The checks that need no training run: build, FSDP2, LoRA, and the export of a
run's final model. Each is a step: ``step_x(arch, work) -> {check: Outcome}``,
run in a process of its own by ``rlpost.support.runner``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from rlpost.support.common import (
    MAX_GAP,
    VAL_TEXTS,
    CheckFailed,
    Outcome,
    child_error,
    cli_error,
    describe,
    model_dir,
    passed,
    prompt_row,
    run_dir,
    skipped,
)
from rlpost.support.vl import (
    image_row,
    is_vl,
    processor_inputs,
    reference_logprobs,
    with_cause,
    write_image,
)

# transformers' reference attention: vLLM matches it, and SDPA leaves out Gemma 2's
# attention-logit cap.
REFERENCE_ATTENTION = "eager"


def step_build(arch: str, work: Path) -> dict[str, Outcome]:
    from rlpost.models.archs import GEMMA_SLIDING_WINDOW, build_arch_model, is_gemma
    from rlpost.models.vl import build_vl_model

    build = build_vl_model if is_vl(arch) else build_arch_model
    out = build(arch, model_dir(work))
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        n = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118
    text = f"{n / 1e6:.2f} M parameters"
    if is_gemma(arch):
        text += f", sliding window {GEMMA_SLIDING_WINDOW} tokens"
    if is_vl(arch):
        row = image_row(prompt_row(VAL_TEXTS[0]), write_image(work / "build.png", 0))
        inputs = processor_inputs(out, row)
        text += f", a prompt with an image: {inputs['input_ids'].shape[1]} tokens"
    return {"build": passed(text)}


def step_fsdp(arch: str, work: Path) -> dict[str, Outcome]:
    """FSDP2 on this machine's device: log-prob parity with transformers, one update.
    A VL model's samples hold an image each, and its vision tower trains here too
    (``freeze_vision=False``), so that the backward pass goes through it.

    Legend: b = samples, t = tokens.
    """
    import torch
    import torch.nn.functional as F

    from rlpost.algos import PolicyLossConfig
    from rlpost.device import resolve_device
    from rlpost.runtime.hf_format import auto_class, vision_parameters
    from rlpost.support.vl import fsdp_samples
    from rlpost.trainers.batch import TrajectoryBatch, pad_sequences
    from rlpost.trainers.fsdp import FSDPEngine, FSDPEngineConfig

    device = resolve_device("auto")
    path = str(model_dir(work))
    rendezvous = work / "fsdp.rendezvous"
    rendezvous.unlink(missing_ok=True)
    vl = is_vl(arch)
    engine = FSDPEngine(
        FSDPEngineConfig(
            model_path=path, lr=1e-3, lr_warmup_steps=0, device=device.kind, backend=device.backend, seed=0,
            freeze_vision=not vl,
        ),
        rank=0,
        world_size=1,
        init_method=f"file://{rendezvous}",
    )  # fmt: skip
    try:
        # Ragged samples longer than Gemma's sliding window, random token ids.
        g = torch.Generator().manual_seed(0)
        lengths = [(12, 20), (30, 6), (5, 27), (20, 14)]  # (prompt, response)
        reference = auto_class(path).from_pretrained(
            path, dtype=torch.float32, attn_implementation=REFERENCE_ATTENTION
        )
        mm_inputs_b = None
        if vl:  # the processor's prompt with an image, then a random response
            ids, prompts, mm_inputs_b, ref_inputs = fsdp_samples(
                path, work, [r for _, r in lengths], g
            )
            lengths = [(p, len(s) - p) for p, s in zip(prompts, ids)]
        else:
            vocab = engine.model.config.vocab_size
            ids = [torch.randint(0, vocab, (p + r,), generator=g).tolist() for p, r in lengths]
        batch = TrajectoryBatch(
            input_ids_bt=pad_sequences(ids, 0),
            attention_mask_bt=pad_sequences([[1] * len(s) for s in ids], 0),
            response_mask_bt=pad_sequences([[0] * p + [1] * r for p, r in lengths], 0),
            mm_inputs_b=mm_inputs_b,
        )
        logp_bt = engine.logprobs(batch)
        if vl:  # one sample at a time, with the processor's own outputs
            refs = [reference_logprobs(reference, s, x) for s, x in zip(ids, ref_inputs)]
            ref_bt = torch.nn.utils.rnn.pad_sequence(refs, batch_first=True)
            ref_bt = ref_bt * batch.response_mask_bt
        else:
            with torch.no_grad():
                logits_btv = reference(
                    input_ids=batch.input_ids_bt, attention_mask=batch.attention_mask_bt
                ).logits
            ce_bt = F.cross_entropy(
                logits_btv[:, :-1].transpose(1, 2).float(),
                batch.input_ids_bt[:, 1:],
                reduction="none",
            )
            ref_bt = F.pad(-ce_bt, (1, 0)) * batch.response_mask_bt
        gap = float((logp_bt - ref_bt).abs().max())
        if gap > MAX_GAP:
            raise CheckFailed(f"FSDP2 log-probs differ from transformers' by {gap:.3g}")
        batch.old_logp_bt = logp_bt
        adv_b = torch.randn(len(lengths), generator=g)
        batch.advantages_bt = adv_b[:, None] * batch.response_mask_bt
        metrics = engine.update_policy(batch, PolicyLossConfig())
        loss, grad_norm = metrics["actor/pg_loss"], metrics["actor/grad_norm"]
        no_grad, bad = [], []
        vision = {id(p) for p in vision_parameters(engine.model)}
        for name, p in engine.model.named_parameters():
            if p.grad is None:
                no_grad.append(name)
                continue
            grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            if not torch.isfinite(grad).all():
                bad.append(name)
        if not (math.isfinite(loss) and math.isfinite(grad_norm)) or bad:
            raise CheckFailed(f"non-finite loss {loss}, grad norm {grad_norm} or grads {bad[:3]}")
        if grad_norm == 0:
            raise CheckFailed("the update's gradient is zero")
        n = sum(1 for _ in engine.model.parameters())
        tower = [name for name, p in engine.model.named_parameters() if id(p) in vision]
    finally:
        engine.close()
    text = (
        f"log-probs within {gap:.1e} of transformers'; loss {loss:.3g}, "
        f"grad norm {grad_norm:.3g}; {n - len(no_grad)}/{n} tensors got gradients"
    )
    if vl:
        reached = len(set(tower) - set(no_grad))
        text += f" ({reached}/{len(tower)} of the vision tower and projector)"
        if reached == 0:
            raise CheckFailed(f"{text}: no gradient reached the vision tower")
    return {"fsdp": passed(text)}


def step_lora(arch: str, work: Path) -> dict[str, Outcome]:
    """rlpost's default LoRA settings on this architecture: what they adapt, and
    that the merged weights a sync sends (``merged_hf_weights``) equal PEFT's merge."""
    import torch

    from rlpost.config.compose import compose
    from rlpost.runtime.hf_format import language_model, load_model
    from rlpost.trainers.fsdp.lora import adapter_config, apply_lora, merged_hf_weights

    settings = compose(["model.lora.rank=8"]).model.lora
    path = str(model_dir(work))
    model = load_model(path, torch.float32)
    layers = model.config.get_text_config().num_hidden_layers
    peft = apply_lora(model, settings, path)
    language = {id(m) for m in language_model(peft).modules()}
    adapted = [name for name, module in peft.named_modules() if hasattr(module, "lora_A")]
    outside = [n for n, m in peft.named_modules() if hasattr(m, "lora_A") and id(m) not in language]
    if is_vl(arch) and outside:  # a VL model's default targets: the language model's only
        raise CheckFailed(
            f"adapts {len(outside)} modules outside the language model: {outside[:3]}"
        )
    config = adapter_config(peft)
    names = sorted({n.rsplit(".", 1)[-1] for n in config["target_modules"]})
    # PEFT adapts fused 3-D parameters (transformers' MoE experts) as parameters.
    params = sorted(config.get("target_parameters") or [])
    if not adapted:
        raise CheckFailed(f"target_modules={settings.target_modules!r} matched no module")
    uncovered = [
        i for i in range(layers) if not any(f".layers.{i}.self_attn." in n for n in adapted)
    ]
    if uncovered:
        raise CheckFailed(f"no attention module adapted in layers {uncovered}; adapted {names}")
    text = f"{len(adapted)} modules ({', '.join(names)})"
    if params:
        text += f" and parameters ({', '.join(params)})"
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if ".lora_B." in name:  # PEFT starts B at 0: make the update non-zero
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    state = {k: v.detach().clone() for k, v in peft.state_dict().items()}
    try:
        merged = merged_hf_weights(state, settings)
    except Exception as exc:
        raise CheckFailed(
            f"adapts {text}, but merging the adapter for a weight sync "
            f"(rollout.lora_sync=merged) failed: {describe(exc)}"
        ) from exc
    reference = peft.merge_and_unload().state_dict()
    if merged.keys() != reference.keys():
        extra = sorted(merged.keys() - reference.keys())[:3]
        lost = sorted(reference.keys() - merged.keys())[:3]
        raise CheckFailed(f"merged names differ from PEFT's: extra {extra}, missing {lost}")
    gap = max(float((merged[k] - reference[k]).abs().max()) for k in merged)
    if gap > 1e-5:
        raise CheckFailed(f"merged weights differ from PEFT's merge by {gap:.3g}")
    text += f"; merged weights within {gap:.1e} of PEFT's merge"
    return {"lora": passed(text)}


def step_export(arch: str, work: Path) -> dict[str, Outcome]:
    """The run's final model: vLLM samples from it, transformers scores the samples."""
    final = run_dir(work) / "final"
    if not (final / "config.json").exists():
        log = work / "run.log"
        output = log.read_text(errors="replace") if log.exists() else ""
        if "in save_hf" in output:  # the run failed writing it
            raise CheckFailed(f"writing the final model: {cli_error(output)}")
        return {"export": skipped("not reached: the run wrote no final model")}
    gap = engine_parity(final, work / "export")
    if gap > MAX_GAP:
        raise CheckFailed(
            with_cause(arch, f"vLLM's log-probs differ from transformers' by {gap:.3g}")
        )
    return {"export": passed(f"vLLM and transformers log-probs within {gap:.1e}")}


def engine_parity(model: Path, out: Path) -> float:
    """Largest gap between the log-probs of tokens rlpost's vLLM engine samples from
    ``model`` and transformers' log-probs of the same tokens (the prompt holds an
    image for a vision-language model).

    Transformers scores in another process: vLLM's Transformers backend (e.g. for
    GlmForCausalLM) patches transformers classes in the process it runs in.
    """
    from transformers import AutoTokenizer

    from rlpost.data.images import row_images
    from rlpost.data.samples import encode_prompt
    from rlpost.device import resolve_device
    from rlpost.rollout.base import GenerationRequest, SamplingConfig
    from rlpost.rollout.vllm import VLLMEngine, VLLMEngineConfig
    from rlpost.runtime.hf_format import is_vision_language

    out.mkdir(parents=True, exist_ok=True)
    row = prompt_row(VAL_TEXTS[0])
    if is_vision_language(str(model)):
        row = image_row(row, write_image(out / "image.png", 0))
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompt = encode_prompt(tokenizer, row)
    device = resolve_device("auto").kind
    engine = VLLMEngine(
        VLLMEngineConfig(model_path=str(model), kv_cache_gib=0.0625, seed=0, device=device)
    )
    sampling = SamplingConfig(n=2, temperature=1.0, max_tokens=16, seed=0)
    request = GenerationRequest(prompt_ids=prompt, sampling=sampling, images=row_images(row))
    (result,) = engine.generate([request])
    # With an image, the engine's prompt ids are the expanded ones.
    samples = [
        {"ids": result.prompt_ids + c.token_ids, "start": len(result.prompt_ids),
         "logprobs": c.logprobs}
        for c in result.completions
    ]  # fmt: skip
    (out / "samples.json").write_text(json.dumps(samples))
    (out / "row.json").write_text(json.dumps(row))
    cmd = [sys.executable, "-m", "rlpost.support.runner", "score-hf", str(model), str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode:
        raise CheckFailed(f"transformers: {child_error(proc.stderr)}")
    return json.loads((out / "gap.json").read_text())["gap"]


def score_hf(model_path: Path, out: Path) -> None:
    """Transformers' log-probs of ``out/samples.json`` (prompted by ``out/row.json``,
    whose images the model's processor prepares); writes the largest gap to
    ``out/gap.json``."""
    import torch

    from rlpost.runtime.hf_format import auto_class, is_vision_language

    model = auto_class(str(model_path)).from_pretrained(
        model_path, dtype=torch.float32, attn_implementation=REFERENCE_ATTENTION
    )
    row = json.loads((out / "row.json").read_text())
    inputs = processor_inputs(model_path, row) if is_vision_language(str(model_path)) else {}
    gap = 0.0
    for s in json.loads((out / "samples.json").read_text()):
        logp_t = reference_logprobs(model, s["ids"], inputs)
        for i, lp in enumerate(s["logprobs"]):
            gap = max(gap, abs(lp - float(logp_t[s["start"] + i])))
    (out / "gap.json").write_text(json.dumps({"gap": gap}))
