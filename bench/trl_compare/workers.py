"""The parts that run in their own processes: TRL's trainer (in TRL's venv) and
the raw limit (in rlpost's venv); and the held-out accuracy both are scored by.

Only the standard library is imported at the top: TRL's venv runs this too.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from trl_compare.common import SEED, Setup

# -- workers (run in their own processes) ----------------------------------------------------


def trl_worker(spec_path: str) -> None:
    """Runs in bench/.venv-trl: TRL's GRPOTrainer on the spec's prompts."""
    import importlib.util

    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    spec = json.loads(Path(spec_path).read_text())
    s = Setup(**spec["setup"])
    out = Path(spec["out"])
    mod_spec = importlib.util.spec_from_file_location("arith", spec["arith_py"])
    assert mod_spec is not None and mod_spec.loader is not None
    arith = importlib.util.module_from_spec(mod_spec)
    sys.modules["arith"] = arith  # dataclasses look their module up there
    mod_spec.loader.exec_module(arith)

    samples = spec["prompts"] * spec["n"]
    micro = min(s.micro_batch, samples)
    assert samples % micro == 0, "samples per step must be a multiple of the micro-batch"
    per_step: list[dict[str, float]] = []

    def correctness(completions, completion_ids, answer, **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        scores = [arith.correctness(t, {"answer": a}) for t, a in zip(texts, answer, strict=True)]
        per_step.append({
            "tokens": float(sum(len(ids) for ids in completion_ids)),
            "reward": sum(scores) / len(scores),
            "samples": float(len(scores)),
        })  # fmt: skip
        return scores

    class StepTimes(TrainerCallback):
        def __init__(self) -> None:
            self.begin: list[float] = []
            self.end: list[float] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.begin.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            self.end.append(time.perf_counter())

    config = GRPOConfig(
        output_dir=str(out / "trainer"),
        max_steps=s.steps,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=samples // micro,  # one optimizer step per RL step
        num_generations=spec["n"],
        max_completion_length=s.max_tokens,
        temperature=s.temperature,
        top_p=1.0,
        learning_rate=s.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=0.9,
        adam_beta2=0.99,  # rlpost's default betas
        weight_decay=0.0,
        max_grad_norm=1.0,
        loss_type="dapo",  # token-mean over the global batch = rlpost's token-mean
        beta=0.0,
        epsilon=0.2,
        scale_rewards="group",
        num_iterations=1,
        shuffle_dataset=False,  # the rows are already in rlpost's order
        gradient_checkpointing=False,  # TRL's default is True; rlpost's is off
        bf16=s.precision == "bf16",  # autocast around generation and training
        use_cpu=True,
        seed=SEED,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        model_init_kwargs={"dtype": "float32"},
        **trl_generation_args(spec, s),
    )
    if spec["threads"] is not None:
        torch.set_num_threads(spec["threads"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    timer = StepTimes()
    trainer = GRPOTrainer(
        model=spec["model"],
        reward_funcs=[correctness],
        args=config,
        train_dataset=Dataset.from_list(spec["rows"]),
        processing_class=tokenizer,
        callbacks=[timer],
    )
    gen_s: list[float] = []
    sync_s: list[float] = []
    if spec.get("use_vllm"):
        vg = trainer.vllm_generation
        vg.generate = _timed(vg.generate, gen_s)
        vg.sync_weights = _timed(vg.sync_weights, sync_s)
    else:
        trainer.model.generate = _timed(trainer.model.generate, gen_s)
    trainer.train()
    final = out / "final"
    trainer.save_model(str(final))
    walls = [timer.end[0] - timer.begin[0]] + [b - a for a, b in zip(timer.end, timer.end[1:])]
    assert len(per_step) == len(walls) == len(gen_s), (len(per_step), len(walls), len(gen_s))
    steps = [
        {"wall_s": w, "timing/generate_s": g, **p}
        for w, g, p in zip(walls, gen_s, per_step, strict=True)
    ]
    if sync_s:  # TRL syncs before each generation; step 1's has nothing new to send
        for step, sync in zip(steps, sync_s, strict=False):
            step["timing/weight_sync_s"] = sync
    result = {
        "steps": steps,
        "final_model": str(final),
        "trl_version": trl.__version__,
        "transformers_version": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
    }
    (out / "result.json").write_text(json.dumps(result))


def _timed(fn: Any, into: list[float]) -> Any:
    """``fn`` that appends each call's seconds to ``into``."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        into.append(time.perf_counter() - start)
        return result

    return timed


def trl_generation_args(spec: dict, s: Setup) -> dict[str, Any]:
    """GRPOConfig's generation settings beyond the old workload's: forced length, vLLM."""
    args: dict[str, Any] = {}
    if spec.get("use_vllm"):
        args.update(
            use_vllm=True,
            vllm_mode="colocate",
            vllm_max_model_length=256,  # rlpost's rollout.max_model_len
            vllm_enable_sleep_mode=False,
            # On by default, it adds a forward for old log-probs and reweights the
            # loss; rlpost's sync loss has neither, so the two optimise the same thing.
            vllm_importance_sampling_correction=False,
        )
    if s.min_tokens:
        # vLLM's SamplingParams and transformers' GenerationConfig name it differently.
        key = "min_tokens" if spec.get("use_vllm") else "min_new_tokens"
        args["generation_kwargs"] = {key: s.min_tokens}
    return args


def raw_worker(spec_path: str) -> None:
    """The limit: raw vLLM generation, then raw forward+backward+AdamW, per batch."""
    import torch

    spec = json.loads(Path(spec_path).read_text())
    s = Setup(**spec["setup"])
    torch.set_num_threads(spec["threads"])
    results, samples = raw_generate(spec, s)
    torch.set_num_threads(spec["threads"])  # in case vLLM's CPU worker changed it
    for name, seqs in samples.items():
        repeats = spec.get("train_repeats", spec["repeats"])
        results[name]["train_s"] = raw_train(spec["model"], seqs, s, repeats)
    results["threads"] = spec["threads"]
    Path(spec_path).with_suffix(".out.json").write_text(json.dumps(results))


def raw_generate(spec: dict, s: Setup) -> tuple[dict[str, Any], dict[str, list]]:
    """Median seconds to generate each batch with a bare in-process ``vllm.LLM``.

    The engine has rlpost's replica settings (rollout/vllm/engine.py,
    configs/rollout/vllm.yaml) and asks for the sampled tokens' log-probs, as
    an RL step needs. Returns the timings and, per batch, the last batch's
    ``(prompt + completion ids, prompt length)`` for the raw training step.
    """
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=spec["model"],
        dtype="bfloat16" if s.precision == "bf16" else "float32",
        max_model_len=256,
        enforce_eager=True,
        seed=SEED,
        enable_prefix_caching=True,
        logprobs_mode="processed_logprobs",
        kv_cache_memory_bytes=int(s.kv_cache_gib * 2**30),
    )

    def generate(prompt_ids: list[list[int]], n: int, seed: int) -> tuple[float, list]:
        params = SamplingParams(
            n=n, temperature=s.temperature, top_p=1.0, max_tokens=s.max_tokens, seed=seed,
            logprobs=0, min_tokens=s.min_tokens,
        )  # fmt: skip
        prompts = [TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids]
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        seqs = [(list(o.prompt_token_ids) + list(c.token_ids), len(o.prompt_token_ids))
                for o in outs for c in o.outputs]  # fmt: skip
        assert len(seqs) == n * len(prompt_ids), (len(seqs), n, len(prompt_ids))
        return elapsed, seqs

    results: dict[str, Any] = {}
    samples: dict[str, list] = {}
    for name, b in spec["batches"].items():
        prompts = b["prompt_ids"]
        generate(prompts[0], b["n"], seed=0)  # warm-up
        times = []
        for r in range(spec["repeats"]):
            elapsed, samples[name] = generate(prompts[1 + r % (len(prompts) - 1)], b["n"], r + 1)
            times.append(elapsed)
        tokens = sum(len(seq) - p for seq, p in samples[name])
        results[name] = {"gen_s": statistics.median(times), "gen_tokens": tokens}
    return results, samples


def raw_train(model_dir: str, seqs: list, s: Setup, repeats: int) -> float:
    """Median seconds of one plain transformers policy-gradient step on ``seqs``.

    Same micro-batching as rlpost's trainer (``s.micro_batch`` rows, all-padding
    columns trimmed), a clipped-ratio token-mean loss, gradient clipping and an
    AdamW step: the forward+backward an RL update cannot avoid, and no more.
    ``s.precision == "bf16"``: the forward under bf16 autocast, fp32 weights.
    """
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, betas=(0.9, 0.99), weight_decay=0.0)
    pad = model.config.pad_token_id or 0
    width = max(len(q) for q, _ in seqs)
    ids_bt = torch.full((len(seqs), width), pad, dtype=torch.long)
    attn_bt = torch.zeros_like(ids_bt)
    resp_bt = torch.zeros(len(seqs), width)
    for i, (q, p) in enumerate(seqs):
        ids_bt[i, : len(q)] = torch.tensor(q)
        attn_bt[i, : len(q)] = 1
        resp_bt[i, p : len(q)] = 1.0
    adv_b = torch.randn(len(seqs), generator=torch.Generator().manual_seed(SEED))
    total_tokens = resp_bt.sum()

    def step() -> float:
        start = time.perf_counter()
        for i in range(0, len(seqs), s.micro_batch):
            sl = slice(i, i + s.micro_batch)
            w = int(attn_bt[sl].sum(1).max())  # trim all-padding columns
            ids, attn, mask = ids_bt[sl, :w], attn_bt[sl, :w], resp_bt[sl, 1:w]
            with torch.autocast("cpu", torch.bfloat16, enabled=s.precision == "bf16"):
                logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
            logits = logits / s.temperature
            logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
            ratio = torch.exp(logp - logp.detach())
            adv = adv_b[sl, None]
            surrogate = torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
            (-(surrogate * mask).sum() / total_tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    step()  # warm-up
    return statistics.median(step() for _ in range(repeats))


# -- held-out accuracy --------------------------------------------------------------------


def greedy_accuracy(
    model_dir: str, tokenizer_dir: str, val_rows: list[dict], max_tokens: int
) -> float:
    """Greedy transformers decoding of the held-out prompts, scored by the task's check.

    Prompts are grouped by length so no row is padded (positions stay exact).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlpost.data.samples import encode_prompt
    from rlpost.data.tasks.arith import correctness

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    by_len: dict[int, list[tuple[list[int], dict]]] = {}
    for row in val_rows:
        ids = encode_prompt(tok, row)
        by_len.setdefault(len(ids), []).append((ids, row))
    right = 0.0
    with torch.no_grad():
        for length, items in by_len.items():
            ids = torch.tensor([i for i, _ in items])
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=max_tokens,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
            )
            for seq, (_, row) in zip(out[:, length:].tolist(), items, strict=True):
                if tok.eos_token_id in seq:
                    seq = seq[: seq.index(tok.eos_token_id) + 1]
                right += correctness(tok.decode(seq, skip_special_tokens=True), row)
    return right / len(val_rows)
