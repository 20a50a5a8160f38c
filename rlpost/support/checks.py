"""The checks of the support matrix, one step per process.

    python -m rlpost.support.checks STEP ARCH WORK_DIR

runs one step on architecture ARCH and writes ``WORK_DIR/STEP.json``: the
outcome of each check (column of SUPPORT.md) that step decides. Steps run in
fresh processes so that a crash, a hang or a process-wide patch (vLLM's
Transformers backend patches transformers classes where it runs) stays in
the step that caused it:

- ``build``: the tiny model and tokenizer of ``rlpost.archs``;
- ``fsdp``: FSDP2 load, log-probs equal to plain transformers', one policy
  update with finite loss and gradients;
- ``lora``: rlpost's default LoRA targets resolve, and the merged weights a
  sync sends equal PEFT's own merge;
- ``run``: the real CLI, two GRPO steps on user data files with a user reward,
  which decides three columns: ``vllm`` (the rollout loaded and generated, its
  log-probs equal the trainer's before any sync), ``sync`` (equal again after
  a weight sync) and ``grpo`` (the steps ran, loss and gradients finite, the
  weights moved);
- ``export``: the run's final model loads in vLLM (through rlpost's engine)
  and in transformers (another process), and the two agree on log-probs.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

# Columns of SUPPORT.md, in order, with what each checks.
CHECKS: dict[str, str] = {
    "build": "tiny random-weight model and byte-level BPE tokenizer built and saved",
    "fsdp": "FSDP2 load; log-probs equal transformers'; one update with finite loss and grads",
    "lora": "default LoRA targets (all-linear) resolve; merged sync weights equal PEFT's merge",
    "vllm": "vLLM loads and generates in a GRPO run; log-probs equal the trainer's before any sync",
    "sync": f"after a weight sync the rollout's log-probs equal the trainer's (< {1e-3:g})",
    "grpo": "two GRPO steps through `python -m rlpost.main` with user files and reward",
    "export": "the run's final model loads in transformers and in vLLM; their log-probs agree",
}
# Steps (one process each) and the checks each decides.
STEPS: dict[str, tuple[str, ...]] = {
    "build": ("build",),
    "fsdp": ("fsdp",),
    "lora": ("lora",),
    "run": ("vllm", "sync", "grpo"),
    "export": ("export",),
}
MAX_GAP = 1e-3  # log-prob agreement required wherever two engines score the same tokens
GRPO_STEPS = 2  # two steps: the second samples from weights the first one synced

Status = Literal["pass", "fail", "skip"]


@dataclass(frozen=True)
class Outcome:
    status: Status
    text: str  # pass: what was measured; fail: the error; skip: why it did not run

    @staticmethod
    def from_json(raw: dict[str, Any]) -> Outcome:
        return Outcome(raw["status"], raw["text"])


def passed(text: str) -> Outcome:
    return Outcome("pass", text)


def failed(text: str) -> Outcome:
    return Outcome("fail", text)


def skipped(text: str) -> Outcome:
    return Outcome("skip", text)


class CheckFailed(Exception):
    """A check ran and found the architecture not working; the message says how."""


def describe(exc: BaseException) -> str:
    """One line, at most 300 characters: the message of a CheckFailed, else ``Type: message``."""
    text = str(exc) if isinstance(exc, CheckFailed) else f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())[:300]


def model_dir(work: Path) -> Path:
    return work / "model"


def run_dir(work: Path) -> Path:
    return work / "run"


# -- build ------------------------------------------------------------------


def step_build(arch: str, work: Path) -> dict[str, Outcome]:
    from rlpost.archs import GEMMA_SLIDING_WINDOW, build_arch_model, is_gemma

    out = build_arch_model(arch, model_dir(work))
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        n = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118
    text = f"{n / 1e6:.2f} M parameters"
    if is_gemma(arch):
        text += f", sliding window {GEMMA_SLIDING_WINDOW} tokens"
    return {"build": passed(text)}


# -- FSDP2 ------------------------------------------------------------------


def step_fsdp(arch: str, work: Path) -> dict[str, Outcome]:
    """FSDP2 on this machine's device: log-prob parity with transformers, one update.

    Legend: b = samples, t = tokens.
    """
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    from algos import PolicyLossConfig
    from rlpost.device import resolve_device
    from trainers.batch import TrajectoryBatch, pad_sequences
    from trainers.fsdp import FSDPEngine, FSDPEngineConfig

    device = resolve_device("auto")
    path = str(model_dir(work))
    rendezvous = work / "fsdp.rendezvous"
    rendezvous.unlink(missing_ok=True)
    engine = FSDPEngine(
        FSDPEngineConfig(
            model_path=path, lr=1e-3, device=device.kind, backend=device.backend, seed=0
        ),
        rank=0,
        world_size=1,
        init_method=f"file://{rendezvous}",
    )
    try:
        # Ragged samples longer than Gemma's sliding window, random token ids.
        g = torch.Generator().manual_seed(0)
        lengths = [(12, 20), (30, 6), (5, 27), (20, 14)]  # (prompt, response)
        vocab = engine.model.config.vocab_size
        ids = [torch.randint(0, vocab, (p + r,), generator=g).tolist() for p, r in lengths]
        batch = TrajectoryBatch(
            input_ids_bt=pad_sequences(ids, 0),
            attention_mask_bt=pad_sequences([[1] * len(s) for s in ids], 0),
            response_mask_bt=pad_sequences([[0] * p + [1] * r for p, r in lengths], 0),
        )
        logp_bt = engine.logprobs(batch)
        reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        with torch.no_grad():
            logits_btv = reference(
                input_ids=batch.input_ids_bt, attention_mask=batch.attention_mask_bt
            ).logits
        ce_bt = F.cross_entropy(
            logits_btv[:, :-1].transpose(1, 2).float(), batch.input_ids_bt[:, 1:], reduction="none"
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
    finally:
        engine.close()
    return {
        "fsdp": passed(
            f"log-probs within {gap:.1e} of transformers'; loss {loss:.3g}, "
            f"grad norm {grad_norm:.3g}; {n - len(no_grad)}/{n} tensors got gradients"
        )
    }


# -- LoRA -------------------------------------------------------------------


def step_lora(arch: str, work: Path) -> dict[str, Outcome]:
    """rlpost's default LoRA settings on this architecture: what they adapt, and
    that the merged weights a sync sends (``merged_hf_weights``) equal PEFT's merge."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlpost.config import compose
    from trainers.fsdp.lora import LoraSettings, adapter_config, apply_lora, merged_hf_weights

    lora_cfg = compose(["model.lora.rank=8"]).model.lora
    targets = lora_cfg.target_modules
    settings = LoraSettings(
        rank=lora_cfg.rank,
        alpha=lora_cfg.alpha,
        dropout=lora_cfg.dropout,
        target_modules=targets if isinstance(targets, str) else tuple(targets),
    )
    path = str(model_dir(work))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    layers = model.config.num_hidden_layers
    peft = apply_lora(model, settings, path)
    adapted = [name for name, module in peft.named_modules() if hasattr(module, "lora_A")]
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
    text += f"; merged weights within {gap:.0e} of PEFT's merge"
    return {"lora": passed(text)}


# -- the CLI run ------------------------------------------------------------

TRAIN_TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "reinforcement learning with rewards",
    "a red square and a blue circle",
    "sort these words apple banana cherry",
]
VAL_TEXTS = ["what is the capital of france", "one two three four five"]
# A reward that differs between almost any two completions, so every group of
# samples has a non-zero advantage and the policy moves.
REWARD_PY = "def score(completion, row):\n    return (sum(map(ord, completion)) % 101) / 100\n"


def _row(text: str) -> dict:
    return {
        "prompt": [{"role": "user", "content": f"Reverse the letters of each word: {text}."}],
        "answer": " ".join(w[::-1] for w in text.split()),
    }


def cli_command(work: Path) -> list[str]:
    """``python -m rlpost.main`` on the built model with user files and reward."""
    data = work / "data"
    data.mkdir(exist_ok=True)
    for name, texts in (("train", TRAIN_TEXTS), ("val", VAL_TEXTS)):
        (data / f"{name}.jsonl").write_text("".join(json.dumps(_row(t)) + "\n" for t in texts))
    (data / "reward.py").write_text(REWARD_PY)
    return [
        sys.executable, "-m", "rlpost.main", "algo=grpo",
        f"model.path={model_dir(work)}",
        "data=files",
        f"data.train_files=[{data / 'train.jsonl'}]",
        f"data.val_files=[{data / 'val.jsonl'}]",
        "reward=custom",
        f"reward.fn={data / 'reward.py'}:score",
        "reward.num_workers=0",
        "data.prompts_per_step=2", "rollout.n=4", "rollout.max_tokens=16", "data.val_size=2",
        f"trainer.total_steps={GRPO_STEPS}", "trainer.val_every=0",
        "trainer.lr=1e-3", "trainer.lr_warmup_steps=0",
        "rollout.kv_cache_gib=0.0625",
        # Measure the gap (the sync column) rather than stop the run at it.
        "rollout.max_logprob_gap=null",
        "trainer.logger=[console,jsonl]",
        f"trainer.run_dir={run_dir(work)}",
    ]  # fmt: skip


ANSI = re.compile(r"\x1b\[[0-9;]*m")
ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception)(?:\([\w.]+\))?: .+")


def cli_error(output: str) -> str:
    """The error a failed CLI run reports: rlpost's ``error: ...`` line, else the
    last exception line of a traceback (a Ray task error repeats the worker's)."""
    lines = [ANSI.sub("", line).strip() for line in output.splitlines()]
    for line in reversed(lines):
        if line.startswith("error: "):
            return line.removeprefix("error: ")
    for line in reversed(lines):
        if ERROR_LINE.match(line):
            return line
    tail = [line for line in lines if line]
    return tail[-1] if tail else "no output"


def _failing_part(output: str) -> str:
    """Which check a failed run's error belongs to, from where its traceback went."""
    if "RolloutWorker.load_weights" in output or "RolloutWorker.load_lora" in output:
        return "sync"
    if "RolloutWorker" in output:
        return "vllm"
    if "in save_hf" in output:  # writing run_dir/final after the last step
        return "export"
    return "grpo"


def _finite(row: dict, *keys: str) -> bool:
    return all(k in row and math.isfinite(row[k]) for k in keys)


def step_run(arch: str, work: Path) -> dict[str, Outcome]:
    shutil.rmtree(run_dir(work), ignore_errors=True)
    ray_tmp = Path(tempfile.mkdtemp(prefix="rlpost-ray-", dir="/tmp"))  # short socket paths
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(TQDM_DISABLE="1", RAY_TMPDIR=str(ray_tmp))
    log = work / "run.log"
    try:
        with open(log, "w") as log_file:
            proc = subprocess.run(
                cli_command(work), stdout=log_file, stderr=subprocess.STDOUT, env=env, timeout=1200
            )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    metrics = run_dir(work) / "metrics.jsonl"
    rows = []
    if metrics.exists():
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    final = run_dir(work) / "final"
    change = _weight_change(model_dir(work), final) if (final / "config.json").exists() else None
    out = judge_run(proc.returncode, log.read_text(errors="replace"), rows, change)
    if out["vllm"].status == "pass" and 1 not in {r["step"] for r in rows}:
        # The run stopped before logging step 1's gap: measure it on the initial model.
        try:
            gap = engine_parity(model_dir(work), work / "initial")
        except Exception as exc:
            out["vllm"] = failed(describe(exc))
        else:
            if gap > MAX_GAP:
                out["vllm"] = failed(f"log-probs differ from transformers' by {gap:.3g}")
            else:
                out["vllm"] = passed(f"log-probs within {gap:.1e} of transformers' (no sync)")
    return out


def judge_run(
    returncode: int, output: str, rows: list[dict], weight_change: float | None
) -> dict[str, Outcome]:
    """The vllm, sync and grpo outcomes of a CLI run, from its exit code, output,
    metrics rows and how far the final weights moved from the initial ones (None:
    no final model). A failed run's error goes to the check it belongs to; the
    checks it kept from being decided are skipped."""
    steps = {int(r["step"]): r for r in rows}
    error = cli_error(output) if returncode else ""
    blame = _failing_part(output) if returncode else None
    out: dict[str, Outcome] = {}
    # vllm: validation before step 1 generates with the rollout engine; step 1's
    # samples come from the weights both sides loaded from disk.
    if 1 in steps:
        gap = steps[1]["rollout/logprob_abs_diff_max"]
        if gap > MAX_GAP:
            out["vllm"] = failed(
                f"log-probs differ from the trainer's by {gap:.3g} before any sync"
            )
        else:
            out["vllm"] = passed(f"log-probs within {gap:.1e} of the trainer's before any sync")
    elif 0 in steps and blame != "vllm":
        out["vllm"] = passed("loaded and generated (validation)")
    # sync: every step after the first samples from weights a sync wrote.
    synced = [steps[s]["rollout/logprob_abs_diff_max"] for s in steps if s >= 2]
    if synced:
        gap = max(synced)
        if gap > MAX_GAP:
            out["sync"] = failed(f"log-probs differ from the trainer's by {gap:.3g} after a sync")
        else:
            out["sync"] = passed(f"log-probs within {gap:.1e} of the trainer's after a sync")
    if blame in out:  # that check was decided before the error: the run failed as a whole
        blame = "grpo"
    if blame in ("vllm", "sync"):
        out[blame] = failed(error)
    # grpo: the steps ran, loss and gradients finite, the saved weights moved.
    trained = [steps[s] for s in sorted(steps) if s >= 1]
    bad = [r["step"] for r in trained if not _finite(r, "actor/pg_loss", "actor/grad_norm")]
    if blame == "grpo":
        out["grpo"] = failed(error)
    elif blame in (None, "export"):  # every step ran
        if len(trained) != GRPO_STEPS or bad:
            out["grpo"] = failed(f"{len(trained)} steps logged; non-finite loss or grads in {bad}")
        elif weight_change == 0:
            out["grpo"] = failed("the final weights equal the initial ones")
        else:
            last = trained[-1]
            moved = (
                "no final model"
                if weight_change is None
                else f"weights moved up to {weight_change:.1e}"
            )
            out["grpo"] = passed(
                f"{len(trained)} steps, loss {last['actor/pg_loss']:.3g}, grad norm "
                f"{last['actor/grad_norm']:.3g}; {moved}"
            )
    for part in STEPS["run"]:
        if part not in out:
            out[part] = skipped(f"not reached: the run failed at the {blame} check")
    return out


def _weight_change(initial: Path, final: Path) -> float:
    """Largest absolute change of any tensor the two checkpoints share."""
    from safetensors.torch import load_file

    before = load_file(str(initial / "model.safetensors"))
    after = load_file(str(final / "model.safetensors"))
    if before.keys() != after.keys():
        lost = sorted(before.keys() - after.keys())[:3]
        raise CheckFailed(f"the final model's tensor names differ from the initial's: {lost}")
    return max(float((after[k].float() - before[k].float()).abs().max()) for k in before)


# -- export -----------------------------------------------------------------


def step_export(arch: str, work: Path) -> dict[str, Outcome]:
    """The run's final model: vLLM samples from it, transformers scores the samples."""
    final = run_dir(work) / "final"
    if not (final / "config.json").exists():
        log = work / "run.log"
        output = log.read_text(errors="replace") if log.exists() else ""
        if _failing_part(output) == "export":
            raise CheckFailed(f"writing the final model: {cli_error(output)}")
        return {"export": skipped("not reached: the run wrote no final model")}
    gap = engine_parity(final, work / "export")
    if gap > MAX_GAP:
        raise CheckFailed(f"vLLM's log-probs differ from transformers' by {gap:.3g}")
    return {"export": passed(f"vLLM and transformers log-probs within {gap:.1e}")}


def engine_parity(model: Path, out: Path) -> float:
    """Largest gap between the log-probs of tokens rlpost's vLLM engine samples from
    ``model`` and transformers' log-probs of the same tokens.

    Transformers scores in another process: vLLM's Transformers backend (e.g. for
    GlmForCausalLM) patches transformers classes in the process it runs in.
    """
    from transformers import AutoTokenizer

    from rlpost.samples import encode_prompt
    from rollout.base import GenerationRequest, SamplingConfig
    from rollout.vllm import VLLMEngine, VLLMEngineConfig

    tokenizer = AutoTokenizer.from_pretrained(model)
    prompt = encode_prompt(tokenizer, _row(VAL_TEXTS[0]))
    engine = VLLMEngine(VLLMEngineConfig(model_path=str(model), kv_cache_gib=0.0625, seed=0))
    sampling = SamplingConfig(n=2, temperature=1.0, max_tokens=16, seed=0)
    (result,) = engine.generate([GenerationRequest(prompt_ids=prompt, sampling=sampling)])
    samples = [
        {"ids": prompt + c.token_ids, "start": len(prompt), "logprobs": c.logprobs}
        for c in result.completions
    ]
    out.mkdir(parents=True, exist_ok=True)
    (out / "samples.json").write_text(json.dumps(samples))
    cmd = [sys.executable, "-m", "rlpost.support.checks", "score-hf", str(model), str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode:
        raise CheckFailed(f"transformers: {child_error(proc.stderr)}")
    return json.loads((out / "gap.json").read_text())["gap"]


def score_hf(model_path: Path, out: Path) -> None:
    """Transformers' log-probs of ``out/samples.json``; writes the largest gap to ``out/gap.json``."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    gap = 0.0
    for s in json.loads((out / "samples.json").read_text()):
        ids = torch.tensor([s["ids"]])
        with torch.no_grad():
            logp_tv = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
        for i, lp in enumerate(s["logprobs"]):
            pos = s["start"] + i
            gap = max(gap, abs(lp - float(logp_tv[pos - 1, s["ids"][pos]])))
    (out / "gap.json").write_text(json.dumps({"gap": gap}))


# -- running a step -----------------------------------------------------------

STEP_FUNCTIONS: dict[str, Callable[[str, Path], dict[str, Outcome]]] = {
    "build": step_build,
    "fsdp": step_fsdp,
    "lora": step_lora,
    "run": step_run,
    "export": step_export,
}


def child_error(stderr: str) -> str:
    """The last exception line of a traceback, else the last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if ERROR_LINE.match(line):
            return " ".join(line.split())[:300]
    return lines[-1][:300] if lines else "no output"


def result_path(work: Path, step: str) -> Path:
    return work / f"{step}.json"


def run_step_here(step: str, arch: str, work: Path) -> None:
    """Run ``step`` in this process; its outcomes (or its error) go to ``STEP.json``."""
    try:
        outcomes = STEP_FUNCTIONS[step](arch, work)
    except Exception as exc:
        outcomes = {check: failed(describe(exc)) for check in STEPS[step]}
        import traceback

        traceback.print_exc()
    result_path(work, step).write_text(
        json.dumps({k: asdict(v) for k, v in outcomes.items()}, indent=1)
    )


def run_step(step: str, arch: str, work: Path, timeout_s: float) -> dict[str, Outcome]:
    """Run ``step`` in a fresh process; a crash or timeout becomes a failed outcome."""
    path = result_path(work, step)
    path.unlink(missing_ok=True)
    log = work / f"{step}.log"
    cmd = [sys.executable, "-m", "rlpost.support.checks", step, arch, str(work)]
    env = {**os.environ, "TQDM_DISABLE": "1"}
    try:
        with open(log, "w") as out:
            proc = subprocess.run(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout_s
            )
    except subprocess.TimeoutExpired:
        return {check: failed(f"timed out after {timeout_s:.0f} s") for check in STEPS[step]}
    if path.exists():
        raw = json.loads(path.read_text())
        return {check: Outcome.from_json(raw[check]) for check in STEPS[step]}
    text = f"crashed (exit code {proc.returncode}): {child_error(log.read_text(errors='replace'))}"
    return {check: failed(text) for check in STEPS[step]}


def main(argv: list[str]) -> int:
    if argv[0] == "score-hf":
        score_hf(Path(argv[1]), Path(argv[2]))
        return 0
    step, arch, work = argv[0], argv[1], Path(argv[2])
    if step not in STEP_FUNCTIONS:
        print(f"unknown step {step!r}; steps are {', '.join(STEP_FUNCTIONS)}", file=sys.stderr)
        return 2
    os.environ.setdefault("TQDM_DISABLE", "1")
    start = time.perf_counter()
    run_step_here(step, arch, work)
    print(f"{step} took {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
