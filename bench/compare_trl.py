"""rlpost's GRPO against TRL's GRPOTrainer, and against the machine's limit.

One command, on the CPU, on the built-in arithmetic task:

    python bench/compare_trl.py            # 8x8 and 32x8 samples, 10 steps, 3 repeats
    python bench/compare_trl.py --quick    # 8x8 only, 3 steps, 1 repeat (a smoke run)

Both frameworks start from the same files: rlpost's warmed-up built-in model
is copied once into the run directory and passed to each as a local path. They
train on the same prompts in the same order (rlpost's seeded prompt stream,
handed to TRL as an unshuffled dataset), with the same batch (prompts per step
x samples per prompt, micro-batches of ``--micro-batch`` samples), completion
length, temperature, learning rate (constant, no warm-up), AdamW betas,
gradient clipping and loss: GRPO's clipped ratio (0.2) on group-normalised
advantages, token-mean over the global batch (TRL ``loss_type="dapo"``), no KL.
The reward is rlpost's ``rlpost.tasks.arith.correctness`` in both (TRL's worker
loads that file). Each repeat runs rlpost sync, TRL (torch's default threads),
rlpost one_step_off and TRL with one thread, in reverse order every other
repeat; the table reports medians.

Measured per run:

- step time: wall clock from the end of one step to the end of the next, over
  steps 2..N (step 1 carries one-off warm-up costs). rlpost: when each step's
  line lands in ``metrics.jsonl`` (polled every 20 ms; the final validation,
  ``timing/val_s``, is subtracted from the last step); TRL: a ``TrainerCallback``.
- generated tokens per second: completion tokens of the step (up to and
  including the end token) / step time.
- peak memory: the largest sum of proportional set size (PSS, shared pages
  split between the processes that map them) over the whole process tree of the
  run (for rlpost: the CLI, Ray's GCS, raylet and dashboard processes and every
  Ray worker, all descendants of the CLI), sampled every 0.2 s. Peak summed RSS
  (counts shared pages once per process) is reported beside it.
- held-out accuracy: the bench's own greedy decoding with transformers of each
  run's saved final model on the task's held-out prompts (same code for both).

The limit: in a separate process, raw vLLM generation of the same batch
(``vllm.LLM`` in-process with the engine settings of rlpost's replica, same
n / max_tokens / temperature, sampled-token log-probs) and a raw
transformers forward+backward+AdamW step on the generated tokens with the same
micro-batching, each at 1 and 2 torch threads; the faster is the limit. The
ratios are rlpost's step time over (gen + train) for ``sync`` and over
max(gen, train) for ``one_step_off``.

Writes bench/RESULTS.md and prints it; per-run logs, metrics and models stay
in bench/.runs/<time>/ (``--report DIR`` rewrites the table from one). TRL runs
in its own virtual environment, bench/.venv-trl, created on first use (torch
2.13.0 CPU + the TRL pip picks). bench/README.md describes the method.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
SRC = REPO  # the rlpost checkout under test (--rlpost-src)
TRL_VENV = BENCH / ".venv-trl"
RUNS = BENCH / ".runs"
RESULTS = BENCH / "RESULTS.md"
SEED = 0  # also rlpost's train/held-out split: every run uses it

# Targets the table is judged against (issue 7).
TARGET_TOKS_RATIO = 3.0  # rlpost gen tokens/s >= 3x TRL's at the larger batch
TARGET_SYNC_LIMIT = 1.3  # rlpost sync step <= 1.3 x (raw gen + raw train)

# The runs of one repeat, in order (reversed every other repeat). TRL is one
# process and by default uses torch's thread count (one per core); rlpost runs
# two single-threaded processes. On a shared two-core machine two spinning
# OpenMP threads can be far slower than one, so TRL also runs with one thread
# and the faster of the two is the one rlpost is judged against.
TRL_N, TRL_1 = "TRL", "TRL, 1 thread"
KINDS = ("rlpost sync", TRL_N, "rlpost one_step_off", TRL_1)
SHOWN = {TRL_N: "TRL, torch's default threads"}


@dataclass(frozen=True)
class Batch:
    prompts: int
    n: int

    @property
    def name(self) -> str:
        return f"{self.prompts}x{self.n}"

    @property
    def samples(self) -> int:
        return self.prompts * self.n


@dataclass(frozen=True)
class Setup:
    steps: int
    repeats: int
    max_tokens: int
    temperature: float
    lr: float
    micro_batch: int


# -- process-tree sampling ------------------------------------------------------------


def _pss_kib(pid: int) -> int | None:
    """Proportional set size of ``pid`` in KiB (None if unreadable or gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class TreeMonitor(threading.Thread):
    """Samples the memory of a process and all its descendants; optionally
    timestamps each line appended to a file (rlpost's metrics.jsonl)."""

    def __init__(self, pid: int, watch: Path | None = None, mem_every_s: float = 0.2):
        super().__init__(daemon=True)
        import psutil

        self.root = psutil.Process(pid)
        self.watch, self.mem_every_s = watch, mem_every_s
        self.peak_pss = self.peak_rss = 0  # bytes
        self.peak_procs: list[str] = []
        self.line_times: list[float] = []
        self._halt = threading.Event()

    def run(self) -> None:
        import psutil

        next_mem = 0.0
        while not self._halt.is_set():
            now = time.perf_counter()
            self._poll_file(now)
            if now >= next_mem:
                next_mem = now + self.mem_every_s
                try:
                    procs = {q.pid: q for q in [self.root, *self.root.children(recursive=True)]}
                except psutil.NoSuchProcess:
                    continue
                pss = rss = 0
                names = []
                for p in procs.values():
                    try:
                        r = p.memory_info().rss
                        names.append(p.name())
                    except psutil.Error:
                        continue
                    rss += r
                    pss += (_pss_kib(p.pid) or r // 1024) * 1024
                if pss > self.peak_pss:
                    self.peak_pss, self.peak_procs = pss, names
                self.peak_rss = max(self.peak_rss, rss)
            self._halt.wait(0.02)

    def _poll_file(self, now: float) -> None:
        if self.watch is None or not self.watch.exists():
            return
        lines = self.watch.read_bytes().count(b"\n")
        self.line_times += [now] * (lines - len(self.line_times))

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self._poll_file(time.perf_counter())


def run_monitored(
    cmd: list[str], log: Path, env: dict[str, str], cwd: Path, timeout: float, watch: Path | None
) -> tuple[int, TreeMonitor, float]:
    """Run ``cmd`` with its output in ``log``; returns (exit code, monitor, seconds)."""
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        mon = TreeMonitor(proc.pid, watch)
        mon.start()
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        mon.stop()
    return rc, mon, time.perf_counter() - start


def _tail(path: Path, lines: int = 3) -> str:
    text = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return " | ".join(text[-lines:])[-400:]


# -- TRL's virtual environment --------------------------------------------------------------


def trl_python() -> Path:
    """bench/.venv-trl's python, creating the venv on first use."""
    py = TRL_VENV / "bin" / "python"
    check = [str(py), "-c", "import trl, transformers; from trl import GRPOTrainer"]
    if py.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return py
    print(f"creating {TRL_VENV} (torch 2.13.0 CPU + trl) ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(TRL_VENV)], check=True)
    (TRL_VENV / ".gitignore").write_text("*\n")
    pip = [str(py), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0", "trl"], check=True)
    # As for vLLM (DESIGN.md): these builds do not match torch 2.13.0+cpu and
    # break transformers' model imports; transformers does not need them.
    extras = ["torchvision", "torchaudio", "torchcodec"]
    subprocess.run([str(py), "-m", "pip", "uninstall", "-y", "-q", *extras], check=False)
    subprocess.run(check, check=True)
    return py


# -- data and the shared model --------------------------------------------------------------


def prepare(run_dir: Path, batches: list[Batch], setup: Setup) -> dict[str, Any]:
    """Copy rlpost's built-in model into ``run_dir/model``; the prompts of every step."""
    from transformers import AutoTokenizer

    from rlpost.config import compose
    from rlpost.data import PromptStream
    from rlpost.samples import encode_prompt
    from rlpost.tasks.arith import ArithTask
    from rlpost.warmup import cache_root, warmup_key

    cfg = compose([f"trainer.seed={SEED}"])
    cached = cache_root(cfg) / warmup_key(cfg)
    if not (cached / "config.json").exists():
        print(f"warming up rlpost's built-in model into {cached} ...", flush=True)
        cmd = [sys.executable, "-m", "rlpost.main", "trainer.total_steps=0",
               f"trainer.run_dir={run_dir / 'warmup'}", "trainer.logger=[jsonl]"]  # fmt: skip
        subprocess.run(cmd, check=True, cwd=SRC, env=rlpost_env())
    model = run_dir / "model"
    shutil.copytree(cached, model)
    tok = AutoTokenizer.from_pretrained(model)
    task = ArithTask(seed=SEED, max_operand=cfg.data.max_operand, num_val=cfg.data.val_size)
    train_rows, val_rows = task.train_rows(), task.val_rows()
    steps: dict[str, list[list[dict]]] = {}
    for b in batches:
        # The rows rlpost's controller takes at steps 1..N (its stream, its seed).
        stream = PromptStream(train_rows, seed=SEED, batch_size=b.prompts)
        steps[b.name] = [stream.next_batch() for _ in range(max(setup.steps, 8))]
    return {
        "model": str(model),
        "model_source": str(cached),
        "steps": steps,
        "val_rows": val_rows,
        "prompt_ids": {
            name: [[encode_prompt(tok, r) for r in rows] for rows in per_step]
            for name, per_step in steps.items()
        },
    }


def rlpost_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("RAY_ADDRESS", None)  # always a fresh local Ray, not a shared cluster
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


# -- one run of each framework --------------------------------------------------------------


def run_rlpost(
    data: dict, b: Batch, setup: Setup, mode: str, out: Path, timeout: float
) -> dict[str, Any]:
    overrides = [
        f"model.path={data['model']}",
        f"data.prompts_per_step={b.prompts}",
        f"rollout.n={b.n}",
        f"rollout.max_tokens={setup.max_tokens}",
        f"rollout.temperature={setup.temperature}",
        f"trainer.lr={setup.lr}",
        "trainer.lr_warmup_steps=0",
        f"trainer.total_steps={setup.steps}",
        "trainer.val_every=0",
        f"trainer.micro_batch_size={setup.micro_batch}",
        f"trainer.async_mode={mode}",
        f"trainer.seed={SEED}",
        f"trainer.run_dir={out}",
        "trainer.logger=[jsonl]",
    ]
    cmd = [sys.executable, "-m", "rlpost.main", *overrides]
    metrics_file = out / "metrics.jsonl"
    rc, mon, wall = run_monitored(
        cmd, out.with_suffix(".log"), rlpost_env(), SRC, timeout, metrics_file
    )
    result: dict[str, Any] = {"rc": rc, "wall_s": wall, "cmd": " ".join(cmd[1:])}
    result.update(peak_pss=mon.peak_pss, peak_rss=mon.peak_rss, procs=mon.peak_procs)
    rows = (
        [json.loads(x) for x in metrics_file.read_text().splitlines()]
        if metrics_file.exists()
        else []
    )
    if rc != 0 or len(rows) < setup.steps + 1:
        result["error"] = _tail(out.with_suffix(".log"))
        return result
    times = mon.line_times  # line k is step k (line 0: the step-0 validation)
    steps = []
    for k in range(1, setup.steps + 1):
        row = rows[k]
        wall_k = times[k] - times[k - 1] - row.get("timing/val_s", 0.0)
        tokens = row["response/length_mean"] * b.samples
        steps.append({
            "wall_s": wall_k,
            "tokens": tokens,
            "reward": row["reward/mean"],
            **{key: v for key, v in row.items() if key.startswith("timing/")},
        })  # fmt: skip
    result.update(steps=steps, final_model=str(out / "final"))
    result["rlpost_val_acc"] = rows[-1].get("val/accuracy")
    return result


def run_trl(
    data: dict, b: Batch, setup: Setup, threads: int | None, out: Path, timeout: float
) -> dict[str, Any]:
    """TRL's GRPOTrainer in bench/.venv-trl; ``threads=None`` keeps torch's default."""
    out.mkdir(parents=True)
    spec = {
        "model": data["model"],
        "rows": [r for rows in data["steps"][b.name][: setup.steps] for r in rows],
        "arith_py": str(SRC / "rlpost" / "tasks" / "arith.py"),
        "prompts": b.prompts,
        "n": b.n,
        "setup": asdict(setup),
        "out": str(out),
        "threads": threads,
    }
    (out / "spec.json").write_text(json.dumps(spec))
    cmd = [str(trl_python()), str(Path(__file__).resolve()), "--trl-worker", str(out / "spec.json")]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    rc, mon, wall = run_monitored(cmd, out.with_suffix(".log"), env, REPO, timeout, None)
    result: dict[str, Any] = {"rc": rc, "wall_s": wall, "peak_pss": mon.peak_pss}
    result.update(peak_rss=mon.peak_rss, procs=mon.peak_procs)
    if rc != 0 or not (out / "result.json").exists():
        result["error"] = _tail(out.with_suffix(".log"))
        return result
    result.update(json.loads((out / "result.json").read_text()))
    return result


def run_raw(data: dict, batches: list[Batch], setup: Setup, threads: int, out: Path) -> dict:
    """Raw vLLM generation and raw forward+backward at ``threads`` torch threads."""
    spec = {
        "model": data["model"],
        "threads": threads,
        "setup": asdict(setup),
        "batches": {b.name: {"n": b.n, "prompt_ids": data["prompt_ids"][b.name]} for b in batches},
        "repeats": 5,
    }
    path = out / f"raw-t{threads}.json"
    path.write_text(json.dumps(spec))
    env = rlpost_env()
    env.update(OMP_NUM_THREADS=str(threads), VLLM_ENABLE_V1_MULTIPROCESSING="0")
    env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--raw-worker", str(path)]
    log = out / f"raw-t{threads}.log"
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=SRC).returncode
    result_path = path.with_suffix(".out.json")
    if rc != 0 or not result_path.exists():
        return {"error": _tail(log)}
    return json.loads(result_path.read_text())


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
        bf16=False,
        use_cpu=True,
        seed=SEED,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        model_init_kwargs={"dtype": "float32"},
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
    generate = trainer.model.generate

    def timed_generate(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = generate(*args, **kwargs)
        gen_s.append(time.perf_counter() - start)
        return result

    trainer.model.generate = timed_generate
    trainer.train()
    final = out / "final"
    trainer.save_model(str(final))
    walls = [timer.end[0] - timer.begin[0]] + [b - a for a, b in zip(timer.end, timer.end[1:])]
    assert len(per_step) == len(walls) == len(gen_s), (len(per_step), len(walls), len(gen_s))
    steps = [
        {"wall_s": w, "timing/generate_s": g, **p}
        for w, g, p in zip(walls, gen_s, per_step, strict=True)
    ]
    result = {
        "steps": steps,
        "final_model": str(final),
        "trl_version": trl.__version__,
        "transformers_version": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
    }
    (out / "result.json").write_text(json.dumps(result))


def raw_worker(spec_path: str) -> None:
    """The limit: raw vLLM generation, then raw forward+backward+AdamW, per batch."""
    import torch

    spec = json.loads(Path(spec_path).read_text())
    s = Setup(**spec["setup"])
    torch.set_num_threads(spec["threads"])
    results, samples = raw_generate(spec, s)
    torch.set_num_threads(spec["threads"])  # in case vLLM's CPU worker changed it
    for name, seqs in samples.items():
        results[name]["train_s"] = raw_train(spec["model"], seqs, s, spec["repeats"])
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
        dtype="float32",
        max_model_len=256,
        enforce_eager=True,
        seed=SEED,
        enable_prefix_caching=True,
        logprobs_mode="processed_logprobs",
        kv_cache_memory_bytes=int(0.25 * 2**30),
    )

    def generate(prompt_ids: list[list[int]], n: int, seed: int) -> tuple[float, list]:
        params = SamplingParams(
            n=n, temperature=s.temperature, top_p=1.0, max_tokens=s.max_tokens, seed=seed,
            logprobs=0,
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
            logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1] / s.temperature
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

    from rlpost.samples import encode_prompt
    from rlpost.tasks.arith import correctness

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


# -- the report -----------------------------------------------------------------------------


def _med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(run: dict[str, Any], batch: Batch) -> dict[str, float]:
    """Per-run medians over steps 2..N (step 1 carries one-off warm-up costs)."""
    steps = run["steps"][1:] or run["steps"]
    out = {
        "step_s": _med([s["wall_s"] for s in steps]),
        "tok_s": _med([s["tokens"] / s["wall_s"] for s in steps]),
        "tokens": _med([s["tokens"] for s in steps]),
        "peak_pss": run["peak_pss"],
        "peak_rss": run["peak_rss"],
        "acc": run.get("acc", float("nan")),
        "reward": _med([s["reward"] for s in run["steps"]]),
    }
    for key in (
        "generate_s",
        "generate_wait_s",
        "logprob_s",
        "update_s",
        "weight_sync_s",
        "step_s",
    ):
        vals = [s[f"timing/{key}"] for s in steps if f"timing/{key}" in s]
        if vals:
            out[f"t_{key}"] = _med(vals)
    return out


def gib(x: float) -> str:
    return f"{x / 2**30:.2f}"


def fmt(x: float, digits: int = 2) -> str:
    return "n/a" if x != x else f"{x:.{digits}f}"


def aggregate(runs: list[dict[str, Any]], b: Batch, kind: str) -> dict[str, float] | str:
    """Medians over the successful runs of ``kind``, or the first failure's message."""
    mine = [r for r in runs if r["batch"] == b.name and r["kind"] == kind]
    ok = [summarize(r, b) for r in mine if "steps" in r]
    if not ok:
        return mine[0].get("error", "not run") if mine else "not run"
    m = {k: _med([o[k] for o in ok if k in o]) for k in ok[0]}
    m["runs"], m["ok"] = len(mine), len(ok)
    m["step_min"], m["step_max"] = min(o["step_s"] for o in ok), max(o["step_s"] for o in ok)
    return m


def explain_sync(b: Batch, m: dict[str, float], lim: dict[str, float]) -> str:
    """Where rlpost's sync step spends the time above raw gen + raw train."""
    gen, train = lim["gen_s"], lim["train_s"]
    parts = {
        "generation": m.get("t_generate_s", float("nan")),
        "old log-prob forward": m.get("t_logprob_s", float("nan")),
        "update": m.get("t_update_s", float("nan")),
        "weight sync": m.get("t_weight_sync_s", float("nan")),
    }
    other = m["step_s"] - sum(parts.values())
    return (
        f"- {b.name}, rlpost sync: step {m['step_s']:.3f} s against a limit of {gen + train:.3f} s "
        f"(+{m['step_s'] - gen - train:.3f} s). Generation {parts['generation']:.3f} s "
        f"(raw vLLM {gen:.3f} s: +{parts['generation'] - gen:.3f} s of Ray round trip, request "
        f"building and result conversion); old log-prob forward {parts['old log-prob forward']:.3f} s "
        f"(not in the limit: with one on-policy mini-batch the old log-probs equal the update's "
        f"own, detached, and TRL skips this forward); update {parts['update']:.3f} s (raw forward+backward+AdamW "
        f"{train:.3f} s: +{parts['update'] - train:.3f} s in the FSDP2 engine); weight sync "
        f"{parts['weight sync']:.3f} s; the rest (scoring, batching, logging; medians need not "
        f"add up) {other:.3f} s."
    )


def report(meta: dict[str, Any], runs: list[dict[str, Any]], raw: dict[str, Any]) -> str:
    batches = [Batch(*b) for b in meta["batches"]]
    s = meta["setup"]
    lines = [
        "# rlpost vs TRL, and rlpost vs the machine's limit",
        "",
        "Written by `bench/compare_trl.py` (method: its docstring and bench/README.md). "
        f"Measured {meta['date']} on {meta['machine']}; load average (1, 5, 15 min) "
        f"{meta['load_before']} before the run and {meta['load_after']} after: other jobs "
        f"shared the machine. Total wall time {meta['wall_min']:.1f} min.",
        "",
        "```bash",
        meta["command"],
        "```",
        "",
        f"rlpost under test: {meta['source']}. Versions: {meta['versions']}.",
        "",
        "Both start from rlpost's warmed-up built-in `tiny` model (Qwen2 architecture, ~1 M "
        "parameters, fp32), copied once and loaded from the same directory, and train on the "
        f"built-in `a+b=` task's prompts in the same order: {s['steps']} GRPO steps, at most "
        f"{s['max_tokens']} completion tokens, temperature {s['temperature']}, lr {s['lr']} "
        f"(constant), AdamW betas (0.9, 0.99), micro-batches of {s['micro_batch']} samples, "
        "clipped ratio 0.2, group-std advantages, token-mean over the global batch (TRL "
        "`loss_type=dapo`), no KL; the reward is `rlpost.tasks.arith.correctness` in both. "
        f"{s['repeats']} repeats, run in alternating order; medians.",
        "",
        "- step s: median wall clock of steps 2..N (step 1 holds one-off warm-up costs), "
        "median over repeats (in brackets: the fastest and slowest repeat).",
        "- gen tokens/s: generated (completion) tokens per second of the whole step.",
        "- peak mem: peak of the summed PSS over the run's process tree (summed RSS, which "
        "counts shared pages once per process, in brackets); rlpost's tree is the CLI, Ray's "
        "GCS, raylet and agents, the trainer and the vLLM replica.",
        f"- held-out acc: greedy accuracy on the {meta['val_rows']} held-out prompts of the saved "
        "final model, decoded by this script with transformers, the same code for both "
        f"(the model before RL: {fmt(meta['base_acc'], 3)}). reward: mean training reward.",
        "- limit: raw in-process `vllm.LLM` generation of the same batch plus a raw "
        "transformers forward+backward+AdamW step on its tokens with the same micro-batches "
        "(each the faster of 1 and 2 torch threads).",
        "",
        "| batch | run | step s | gen tokens/s | peak mem GiB | held-out acc | reward | "
        "step / limit |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    targets: list[str] = []
    breakdown: list[str] = []
    notes: list[str] = []
    for b in batches:
        lim = raw.get(b.name)
        gen, train = (lim["gen_s"], lim["train_s"]) if lim else (float("nan"), float("nan"))
        agg: dict[str, dict[str, float]] = {}
        for kind in KINDS:
            m = aggregate(runs, b, kind)
            if isinstance(m, str):
                shown = SHOWN.get(kind, kind)
                lines.append(f"| {b.name} | {shown} | not available: {m[:200]} | | | | | |")
                continue
            agg[kind] = m
            ratio = ""
            if kind == "rlpost sync":
                ratio = f"{m['step_s'] / (gen + train):.2f}x (gen + train)"
            elif kind == "rlpost one_step_off":
                ratio = f"{m['step_s'] / max(gen, train):.2f}x max(gen, train)"
            label = SHOWN.get(kind, kind)
            label += f" ({m['ok']:.0f}/{m['runs']:.0f} runs ok)" if m["ok"] < m["runs"] else ""
            lines.append(
                f"| {b.name} | {label} | {m['step_s']:.3f} ({m['step_min']:.3f}-{m['step_max']:.3f}) "
                f"| {fmt(m['tok_s'], 0)} | "
                f"{gib(m['peak_pss'])} ({gib(m['peak_rss'])}) | {fmt(m['acc'], 3)} | "
                f"{fmt(m['reward'], 3)} | {ratio} |"
            )
        if lim:
            lines.append(
                f"| {b.name} | limit: raw gen + raw train | "
                f"{gen:.3f} + {train:.3f} = {gen + train:.3f} | "
                f"{lim['gen_tokens'] / (gen + train):.0f} (gen alone {lim['gen_tokens'] / gen:.0f}) "
                f"| | | | threads: gen {lim['gen_threads']}, train {lim['train_threads']} |"
            )
        sync, osf = agg.get("rlpost sync"), agg.get("rlpost one_step_off")
        trls = [(k, agg[k]) for k in (TRL_N, TRL_1) if k in agg]
        largest = b == batches[-1]
        if sync and trls:
            best_kind, best = max(trls, key=lambda kv: kv[1]["tok_s"])
            speed = sync["tok_s"] / best["tok_s"]
            verdict = (
                "met"
                if speed >= TARGET_TOKS_RATIO
                else f"missed by {TARGET_TOKS_RATIO / speed:.2f}x"
            )
            targets.append(
                f"| {b.name} | rlpost sync gen tokens/s >= {TARGET_TOKS_RATIO:g}x TRL's "
                f"(faster TRL: {SHOWN.get(best_kind, best_kind)}) | {speed:.2f}x | "
                f"{verdict if largest else '(reported; the target is for the larger batch)'} |"
            )
            trl_acc = _med(
                [
                    r["acc"]
                    for r in runs
                    if r["batch"] == b.name and r["kind"] in (TRL_N, TRL_1) and "acc" in r
                ]
            )
            diff = sync["acc"] - trl_acc
            targets.append(
                f"| {b.name} | held-out acc rlpost sync >= TRL (all TRL runs), same steps | "
                f"{sync['acc']:.3f} vs {trl_acc:.3f} ({diff:+.3f}) | "
                f"{'met' if diff >= 0 else f'missed by {-diff:.3f}'} |"
            )
            if speed < TARGET_TOKS_RATIO and largest and lim:
                name = SHOWN.get(best_kind, best_kind)
                sync_lim = lim["gen_tokens"] / (gen + train) / best["tok_s"]
                osf_lim = lim["gen_tokens"] / max(gen, train) / best["tok_s"]
                notes.append(
                    f"- {b.name}, tokens/s: rlpost sync {sync['tok_s']:.0f} vs {name} "
                    f"{best['tok_s']:.0f} ({speed:.2f}x; the target needs {TARGET_TOKS_RATIO / speed:.2f}x "
                    f"more). {name}'s step takes {best['step_s']:.3f} s, of which "
                    f"`model.generate` {best['t_generate_s']:.3f} s, while raw vLLM takes "
                    f"{gen:.3f} s for a batch of the same size ({gen / best['t_generate_s']:.1f}x "
                    f"longer): with this ~1 M-parameter model and completions of "
                    f"~{lim['gen_tokens'] / b.samples:.1f} tokens, transformers' batched `generate` "
                    f"on the CPU is not slower than vLLM, so there is no generation advantage to "
                    f"build the {TARGET_TOKS_RATIO:g}x on. Even the limit reaches only {sync_lim:.2f}x "
                    f"TRL's tokens/s synchronously (raw gen + raw train) and {osf_lim:.2f}x with "
                    f"perfect overlap (max of the two): {TARGET_TOKS_RATIO:g}x is out of reach for "
                    f"this workload on this machine, whatever rlpost's overheads."
                )
        if sync and lim:
            r = sync["step_s"] / (gen + train)
            targets.append(
                f"| {b.name} | rlpost sync step <= {TARGET_SYNC_LIMIT:g}x (gen + train) | {r:.2f}x | "
                f"{'met' if r <= TARGET_SYNC_LIMIT else f'missed by {r / TARGET_SYNC_LIMIT:.2f}x'} |"
            )
            notes.append(explain_sync(b, sync, lim))
        if osf and lim:
            targets.append(
                f"| {b.name} | rlpost one_step_off step / max(gen, train) | "
                f"{osf['step_s'] / max(gen, train):.2f}x | (reported; no target) |"
            )
        for kind, m in agg.items():
            keys = (
                "generate_s",
                "generate_wait_s",
                "logprob_s",
                "update_s",
                "weight_sync_s",
                "step_s",
            )
            parts = [f"{k}={m['t_' + k]:.3f}" for k in keys if "t_" + k in m]
            shown = SHOWN.get(kind, kind)
            breakdown.append(f"| {b.name} | {shown} | {fmt(m['step_s'], 3)} | {', '.join(parts)} |")
        if osf and sync:
            notes.append(
                f"- {b.name}, one_step_off: step {osf['step_s']:.3f} s against sync's "
                f"{sync['step_s']:.3f} s ({osf['step_s'] / sync['step_s']:.2f}x). Its generation, "
                f"overlapped with the update, took {osf['t_generate_s']:.3f} s against "
                f"{sync['t_generate_s']:.3f} s alone, and the update {osf['t_update_s']:.3f} s "
                f"against {sync['t_update_s']:.3f} s: on two cores shared with other jobs, the "
                "overlapped halves compete for the same CPUs."
                + (
                    f" Its held-out accuracy, {osf['acc']:.3f}, is below the model's before RL "
                    f"({meta['base_acc']:.3f}); sync reached {sync['acc']:.3f}."
                    if osf["acc"] < meta["base_acc"]
                    else ""
                )
            )
        trl_n = agg.get(TRL_N)
        if trl_n and trl_n["step_max"] > 3 * trl_n["step_min"]:
            notes.append(
                f"- {b.name}, TRL with torch's default threads: {trl_n['step_min']:.3f} to "
                f"{trl_n['step_max']:.3f} s per step between repeats. Each torch op waits for "
                "both of its threads, and other jobs kept taking a core (the raw limit runs show "
                "the same at 2 threads); one thread is steadier. The faster of the two TRL "
                "settings is the reference for the targets."
            )
    same = [r for r in runs if r.get("rlpost_val_acc") is not None and "acc" in r]
    accs: dict[tuple[str, str], set[float]] = {}
    for r in runs:
        if "acc" in r:
            accs.setdefault((r["batch"], r["kind"]), set()).add(round(r["acc"], 6))
    if meta["setup"]["repeats"] > 1 and accs and all(len(v) == 1 for v in accs.values()):
        notes.append(
            "- Accuracy: every repeat of a run reproduced its accuracy exactly (rlpost's "
            "sampling seeds follow `trainer.seed`, which also fixes the train/held-out split, so "
            "it stays 0; TRL's follow its `seed`), so each framework's accuracy is one training "
            "trajectory. The standard error of a difference of two accuracies near 0.5 on 200 "
            "prompts is about 0.05: smaller gaps are within sampling noise."
        )
    agree = sum(abs(r["acc"] - r["rlpost_val_acc"]) < 1e-6 for r in same)
    lines += [
        "",
        "## Targets",
        "",
        "| batch | target | measured | verdict |",
        "| --- | --- | --- | --- |",
    ]
    lines += targets
    lines += [
        "",
        "## Where a step's time goes (medians, seconds)",
        "",
        "rlpost: `timing/*` from metrics.jsonl. `generate_s`: request to results through Ray "
        "(in one_step_off it overlaps the previous update; `generate_wait_s` is the part the "
        "loop waited for); `logprob_s`: old log-probs forward; `update_s`: the trainer's "
        "forward+backward+optimizer step; `weight_sync_s`: export and load into vLLM; `step_s`: "
        "everything after generation. TRL: `generate_s` is its `model.generate` call.",
        "",
        "| batch | run | step s (wall) | components |",
        "| --- | --- | --- | --- |",
        *breakdown,
        "",
        "## Notes",
        "",
        *notes,
        f"- Cross-check: on {agree} of {len(same)} rlpost runs this script's transformers "
        "greedy accuracy equals rlpost's own vLLM `val/accuracy` of the final model.",
    ]
    return "\n".join(lines) + "\n"


# -- orchestration --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="8x8 only, 3 steps, 1 repeat")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batches", default="8x8,32x8", help="prompts x samples, comma-separated")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--micro-batch", type=int, default=64)
    p.add_argument("--timeout", type=float, default=600, help="seconds per run")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument(
        "--rlpost-src",
        type=Path,
        default=REPO,
        help="rlpost checkout to benchmark (default: this one), e.g. a `git archive` of a commit",
    )
    p.add_argument("--report", type=Path, help="rewrite the table from a run dir in bench/.runs")
    p.add_argument("--trl-worker", help=argparse.SUPPRESS)
    p.add_argument("--raw-worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.trl_worker:
        trl_worker(args.trl_worker)
        return 0
    if args.raw_worker:
        raw_worker(args.raw_worker)
        return 0
    if args.report:
        runs = [json.loads(x) for x in (args.report / "runs.jsonl").read_text().splitlines()]
        meta = json.loads((args.report / "meta.json").read_text())
        text = report(meta, runs, json.loads((args.report / "raw.json").read_text()))
        args.out.write_text(text)
        print(text)
        return 0
    if args.quick:
        args.steps, args.repeats, args.batches = 3, 1, "8x8"
    global SRC
    SRC = args.rlpost_src.resolve()
    sys.path.insert(0, str(SRC))
    batches = [Batch(*map(int, x.split("x"))) for x in args.batches.split(",")]
    setup = Setup(args.steps, args.repeats, args.max_tokens, 1.0, args.lr, args.micro_batch)

    import psutil  # noqa: F401  (fail here, not in the monitor thread)

    start = time.perf_counter()
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    run_dir = RUNS / time.strftime("%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True)
    (RUNS / ".gitignore").write_text("*\n")
    trl_python()  # create the venv before anything is timed
    data = prepare(run_dir, batches, setup)
    print(f"run dir {run_dir}; model {data['model']} (from {data['model_source']})", flush=True)

    # The limit first, at 1 and 2 torch threads; the faster of each is kept.
    raw: dict[str, Any] = {}
    for threads in (1, 2):
        res = run_raw(data, batches, setup, threads, run_dir)
        print(f"raw (threads={threads}): {res}", flush=True)
        for b in batches:
            if b.name not in res:
                continue
            cur = raw.setdefault(b.name, {"gen_s": float("inf"), "train_s": float("inf")})
            if res[b.name]["gen_s"] < cur["gen_s"]:
                cur.update(
                    gen_s=res[b.name]["gen_s"],
                    gen_tokens=res[b.name]["gen_tokens"],
                    gen_threads=threads,
                )
            if res[b.name]["train_s"] < cur["train_s"]:
                cur.update(train_s=res[b.name]["train_s"], train_threads=threads)

    runs: list[dict[str, Any]] = []
    for b in batches:
        osf_broken = False
        for rep in range(setup.repeats):
            order = list(KINDS)
            if rep % 2:
                order.reverse()
            for kind in order:
                if kind == "rlpost one_step_off" and osf_broken:
                    continue
                out = run_dir / f"{b.name}-{''.join(c if c.isalnum() else '-' for c in kind)}-{rep}"
                if kind.startswith("TRL"):
                    threads = 1 if kind == TRL_1 else None
                    res = run_trl(data, b, setup, threads, out, args.timeout)
                else:
                    mode = kind.split()[1]
                    res = run_rlpost(data, b, setup, mode, out, args.timeout)
                res.update(batch=b.name, kind=kind, rep=rep)
                if "steps" in res:
                    res["acc"] = greedy_accuracy(
                        res["final_model"], data["model"], data["val_rows"], setup.max_tokens
                    )
                    s = summarize(res, b)
                    print(
                        f"{b.name} {kind} #{rep}: step {s['step_s']:.3f}s, {s['tok_s']:.0f} tok/s, "
                        f"peak PSS {gib(s['peak_pss'])} GiB, acc {s['acc']:.3f} "
                        f"(rlpost's own val {res.get('rlpost_val_acc')}), run {res['wall_s']:.0f}s",
                        flush=True,
                    )
                else:
                    print(
                        f"{b.name} {kind} #{rep}: FAILED (rc {res['rc']}): {res['error']}",
                        flush=True,
                    )
                    osf_broken |= kind == "rlpost one_step_off"
                runs.append(res)
                (run_dir / "runs.jsonl").open("a").write(json.dumps(res) + "\n")

    import torch
    import transformers
    import vllm

    trl_run = next((r for r in runs if "trl_version" in r), {})
    cmd = " ".join(["python bench/compare_trl.py", *(sys.argv[1:] if argv is None else argv)])
    source = _describe_source()
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": f"{os.cpu_count()} CPU cores (nproc {len(os.sched_getaffinity(0))}), "
        f"{psutil_total_gib():.0f} GiB RAM, {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}",
        "load_before": load_before,
        "load_after": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "wall_min": (time.perf_counter() - start) / 60,
        "command": cmd,
        "source": source,
        "batches": [(b.prompts, b.n) for b in batches],
        "setup": asdict(setup),
        "val_rows": len(data["val_rows"]),
        "versions": f"torch {torch.__version__}, transformers {transformers.__version__} "
        f"and vLLM {vllm.__version__} (rlpost); TRL {trl_run.get('trl_version', '?')} with "
        f"transformers {trl_run.get('transformers_version', '?')} in {TRL_VENV.relative_to(REPO)}",
        "base_acc": greedy_accuracy(
            data["model"], data["model"], data["val_rows"], setup.max_tokens
        ),
    }
    (run_dir / "meta.json").write_text(json.dumps(meta))
    (run_dir / "raw.json").write_text(json.dumps(raw))
    text = report(meta, runs, raw)
    args.out.write_text(text)
    print(text)
    print(f"wrote {args.out}; raw runs in {run_dir}")
    return 0


def _describe_source() -> str:
    """The benchmarked rlpost: commit, and whether its working tree had changes."""
    git = ["git", "-C", str(SRC)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return f"{SRC} (not a git checkout)"
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    return f"commit {head.stdout.strip()}" + (" + uncommitted changes" if dirty else "")


def psutil_total_gib() -> float:
    import psutil

    return psutil.virtual_memory().total / 2**30


if __name__ == "__main__":
    sys.exit(main())
