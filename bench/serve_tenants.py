"""``rlpost serve``: what the service costs over the same work through rlpost's own
trainer and rollout engines, and what tenants sharing one base model get.

    python bench/serve_tenants.py               # 12 timed steps a tenant, 3 warm-up
    python bench/serve_tenants.py --steps 4     # a smoke run

Two base models, one after the other: the built-in one (~1 M parameters, where
a step is short and the service's fixed cost shows) and the ``small`` tiny
preset (~30 M parameters, random weights: only the time is of interest).

A step is one supervised update of a LoRA adapter (rank 16): ``forward_backward(cross_entropy)`` on 32 addition questions with their
answers (``"37+48="`` -> ``"85"``, the answer and end token weighted 1), then
``optim_step``. It is timed four ways:

- **rlpost's trainer**: the same tokens through the FSDP2 engine rlpost's own RL and
  SFT loops run (``update_sft``, one rank, LoRA rank 16 on every linear layer but
  the head), in a process of its own: what the work costs without the service;
- **direct**: the model host the server runs (``rlpost.serve.host.ModelHost``),
  its own ``forward_backward`` and ``optim_step`` called in this process, no server;
- **SDK, 1 tenant**: the official ``tinker`` SDK in this process, against
  ``rlpost serve`` running as its own process (as it runs for users), the step's
  two calls sent together and both waited for;
- **SDK, 2 and 4 tenants**: as many clients on threads, each its own adapter,
  stepping at once.

Reported: seconds a step (median over the timed steps), the tokens (of the 32
sequences) and steps a second all tenants make together, the service's overhead
(SDK, 1 tenant, over rlpost's trainer and over direct), and the
process's resident memory with every tenant made (one base model, an adapter and
its AdamW moments per tenant: the server's process).

Then sampling as an RL step asks for it: 16 prompts x 8 samples of up to 16
tokens from a tenant's snapshot (``train_unembed=False``, so either sampler
serves it), the 16 requests sent at once, by ``--sampler model`` and by
``--sampler vllm`` (a server of each), seconds per batch (median of 3 after one
warm-up) and sampled tokens a second, and the same requests through rlpost's own
rollout engine (vLLM as the RL loop's replicas run it, in a process of its own). Writes
bench/results/serve_tenants.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TINKER_TELEMETRY", "0")
os.environ.setdefault("TINKER_API_KEY", "tml-bench")

QUESTIONS = 32
RANK = 16
SAMPLES, MAX_TOKENS = 8, 16  # a sampling batch: 16 prompts x SAMPLES, up to MAX_TOKENS
LR = 1e-3
WARMUP = 3


def rows(tokenizer) -> list[tuple[list[int], list[int], list[float]]]:
    """(input tokens, targets, weights) of the step's questions: position i predicts
    token i + 1, the prompt weighted 0."""
    from rlpost.data.tasks.arith import ArithTask

    out = []
    for row in ArithTask().train_rows()[:QUESTIONS]:
        text = tokenizer.apply_chat_template(row["prompt"], tokenize=False,
                                             add_generation_prompt=True)  # fmt: skip
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        answer = [*tokenizer(row["answer"], add_special_tokens=False)["input_ids"],
                  tokenizer.eos_token_id]  # fmt: skip
        tokens = prompt + answer
        weights = [0.0] * (len(prompt) - 1) + [1.0] * len(answer)
        out.append((tokens[:-1], tokens[1:], weights))
    return out


def direct_steps(host, data, steps: int) -> list[float]:
    from rlpost.serve.host import LoraSpec
    from rlpost.serve.wire import DatumIn, ForwardBackwardIn

    host.create("direct", LoraSpec(rank=RANK, seed=0), owner="bench")
    datums = [DatumIn(tokens, {"target_tokens": np.asarray(targets, np.int64),
                               "weights": np.asarray(weights, np.float32)})
              for tokens, targets, weights in data]  # fmt: skip
    times = []
    for i in range(WARMUP + steps):
        start = time.perf_counter()
        host.forward_backward(ForwardBackwardIn("direct", i, "cross_entropy", {}, False, datums))
        host.optim_step("direct", {"learning_rate": LR})
        times.append(time.perf_counter() - start)
    return times[WARMUP:]


def engine_steps(path: str, data, steps: int) -> list[float]:
    """The same step through rlpost's own trainer, the FSDP2 engine its RL and SFT loops
    run (one rank, LoRA rank ``RANK`` on every linear layer but the head):
    ``update_sft`` on the questions' answer tokens, one optimizer step."""
    import socket

    import torch

    from rlpost.trainers.batch import TrajectoryBatch, pad_sequences
    from rlpost.trainers.fsdp.engine import FSDPEngine, FSDPEngineConfig
    from rlpost.trainers.lora_settings import LoraSettings

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cfg = FSDPEngineConfig(model_path=path, lr=LR, lr_warmup_steps=0, betas=(0.9, 0.95),
                           lora=LoraSettings(rank=RANK), micro_batch_size=QUESTIONS,
                           threads=torch.get_num_threads())  # fmt: skip
    engine = FSDPEngine(cfg, 0, 1, f"tcp://127.0.0.1:{port}")
    # a datum's input and its last target are the sequence; its weighted targets the answer
    seqs = [tokens + targets[-1:] for tokens, targets, _ in data]
    masks = [[0, *(int(w) for w in weights)] for _, _, weights in data]
    batch = TrajectoryBatch(
        input_ids_bt=pad_sequences(seqs, 0),
        attention_mask_bt=pad_sequences([[1] * len(s) for s in seqs], 0),
        response_mask_bt=pad_sequences(masks, 0),
    )
    times = []
    try:
        for _ in range(WARMUP + steps):
            start = time.perf_counter()
            engine.update_sft(batch)
            times.append(time.perf_counter() - start)
    finally:
        engine.close()
    return times[WARMUP:]


def tokens_in(data) -> int:
    """The input tokens of a step's sequences."""
    return sum(len(tokens) for tokens, _, _ in data)


def sdk_steps(url: str, model: str, data, tenants: int, steps: int) -> dict:
    import tinker

    with tinker.ServiceClient(base_url=url) as service:  # its session finished at the end
        return _sdk_steps(service, model, data, tenants, steps)


def _sdk_steps(service, model: str, data, tenants: int, steps: int) -> dict:
    import tinker

    datums = [tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens),
                           loss_fn_inputs={"target_tokens": targets, "weights": weights})
              for tokens, targets, weights in data]  # fmt: skip
    clients = [service.create_lora_training_client(base_model=model, rank=RANK, seed=t).result()
               for t in range(tenants)]  # fmt: skip
    times: list[list[float]] = [[] for _ in clients]
    losses: list[list[float]] = [[] for _ in clients]
    ready = threading.Barrier(tenants + 1)

    def loop(t: int) -> None:
        for i in range(WARMUP + steps):
            if i == WARMUP:
                ready.wait()
            start = time.perf_counter()
            fb = clients[t].forward_backward(datums, "cross_entropy")
            opt = clients[t].optim_step(tinker.AdamParams(learning_rate=LR))
            losses[t].append(fb.result().metrics["loss:sum"])
            opt.result()
            times[t].append(time.perf_counter() - start)

    threads = [threading.Thread(target=loop, args=(t,)) for t in range(tenants)]
    for th in threads:
        th.start()
    ready.wait()
    began = time.perf_counter()
    for th in threads:
        th.join()
    wall = time.perf_counter() - began
    step_s = statistics.median(s for ts in times for s in ts[WARMUP:])
    return {"tenants": tenants, "step_s": step_s, "steps_per_s": tenants * steps / wall,
            "tokens_per_s": tenants * steps * tokens_in(data) / wall,
            "loss_first_last": [[ls[0], ls[-1]] for ls in losses]}  # fmt: skip


def sdk_sampling(url: str, model: str, prompts: list[list[int]]) -> dict:
    """Seconds a batch (median of 3 after a warm-up) and the tokens it sampled."""
    import tinker

    with tinker.ServiceClient(base_url=url) as service:  # its session finished at the end
        training = service.create_lora_training_client(
            base_model=model, rank=RANK, seed=0, train_unembed=False
        ).result()
        return _sample_batches(training.save_weights_and_get_sampling_client().result(), prompts)


def _sample_batches(sampler, prompts: list[list[int]]) -> dict:
    import tinker

    times, tokens = [], []
    for rep in range(4):
        params = tinker.SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=rep)
        start = time.perf_counter()
        pending = [sampler.sample(prompt=tinker.ModelInput.from_ints(p), num_samples=SAMPLES,
                                  sampling_params=params) for p in prompts]  # fmt: skip
        results = [f.result() for f in pending]
        times.append(time.perf_counter() - start)
        tokens.append(sum(len(seq.tokens) for r in results for seq in r.sequences))
    return timed(times, tokens)


def engine_sampling(path: str, prompts: list[list[int]], lora: bool = False) -> dict:
    """The same requests through rlpost's own rollout engine, vLLM as the RL loop's
    replicas run it: the base model's weights, or (``lora``) a rank-``RANK`` adapter
    on every linear layer but the head loaded as ``rollout.lora_sync=adapter`` loads
    the trainer's (random, non-zero weights: only the time is of interest)."""
    import torch

    from rlpost.rollout.base import GenerationRequest, SamplingConfig
    from rlpost.rollout.registry import build_engine
    from rlpost.rollout.vllm import VLLMEngineConfig

    threads = torch.get_num_threads()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    engine = build_engine("vllm", VLLMEngineConfig(model_path=path, kv_cache_gib=0.25,
                                                   lora=RANK if lora else 0))  # fmt: skip
    torch.set_num_threads(threads)
    if lora:
        engine.load_lora_adapter(random_adapter(path, Path(tempfile.mkdtemp()) / "adapter"))
    times, tokens = [], []
    for rep in range(4):
        sampling = SamplingConfig(n=SAMPLES, temperature=1.0, max_tokens=MAX_TOKENS, seed=rep)
        start = time.perf_counter()
        results = engine.generate([GenerationRequest(p, sampling) for p in prompts])
        times.append(time.perf_counter() - start)
        tokens.append(sum(len(c.token_ids) for r in results for c in r.completions))
    del engine
    return timed(times, tokens)


def random_adapter(path: str, out: Path) -> str:
    """A PEFT LoRA adapter of rank ``RANK`` for ``path`` with non-zero B matrices."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path)
    names = sorted({n.split(".")[-1] for n, m in model.named_modules()
                    if isinstance(m, torch.nn.Linear) and "lm_head" not in n})  # fmt: skip
    peft = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=16, target_modules=names,
                                            init_lora_weights=False))  # fmt: skip
    peft.save_pretrained(out)
    return str(out)


def timed(times: list[float], tokens: list[int]) -> dict:
    """Median seconds a batch after the first (a warm-up), and sampled tokens a second."""
    s = statistics.median(times[1:])
    return {"s": s, "tokens_per_s": statistics.median(n / t for n, t in zip(tokens[1:], times[1:]))}


def serve(name: str, path: str, port: int, state: Path, sampler: str = "model") -> subprocess.Popen:
    """``rlpost serve`` for ``name`` in a process of its own, once it answers."""
    import urllib.request

    log = open(state / "serve.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlpost.serve", "--port", str(port), "--model", f"{name}={path}",
         "--state-dir", str(state), "--device", "cpu", "--sampler", sampler],
        stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"rlpost serve exited; see {state / 'serve.log'}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/healthz", timeout=1)
            return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"rlpost serve did not answer in 120 s; see {state / 'serve.log'}")


def in_own_process(fn, *args):
    """``fn(*args)`` in a fresh process: rlpost's engines set the process's threads
    (vLLM binds them to cores for good) and its process group, which would change
    what this process measures after them."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def measure(name: str, path: str, steps: int, port: int) -> dict:
    from rlpost.serve.host import ModelHost

    state = Path(tempfile.mkdtemp(prefix="rlpost-serve-bench-"))
    host = ModelHost(name, path, state)
    params = sum(p.numel() for p in host.model.parameters())  # the base model's
    data = rows(host.tokenizer)
    direct = statistics.median(direct_steps(host, data, steps))
    del host
    print(f"{name}: direct {direct:.3f} s a step", flush=True)
    trainer = statistics.median(in_own_process(engine_steps, path, data, steps))
    print(f"{name}: rlpost's trainer {trainer:.3f} s a step", flush=True)
    step_tokens = tokens_in(data)
    server = serve(name, path, port, state)
    try:
        runs = []
        for tenants in (1, 2, 4):
            r = sdk_steps(f"http://127.0.0.1:{port}", name, data, tenants, steps)
            r["rss_gib"] = psutil.Process(server.pid).memory_info().rss / 2**30
            runs.append(r)
            print(f"{name}: SDK, {tenants} tenant(s): {r['step_s']:.3f} s a step, "
                  f"{r['steps_per_s']:.2f} steps/s in all", flush=True)  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=30)
    prompts = [tokens[: weights.index(1.0) + 1] for tokens, _, weights in data[:16]]
    sampling = {}
    for sampler in ("model", "vllm"):
        server = serve(name, path, port, state, sampler)
        try:
            sampling[sampler] = sdk_sampling(f"http://127.0.0.1:{port}", name, prompts)
        finally:
            server.terminate()
            server.wait(timeout=30)
        print(f"{name}: sampling by {sampler}: {sampling[sampler]['s']:.2f} s a batch", flush=True)
    sampling["rollout"] = in_own_process(engine_sampling, path, prompts)
    sampling["rollout_lora"] = in_own_process(engine_sampling, path, prompts, True)
    print(f"{name}: rlpost's rollout engine: {sampling['rollout']['s']:.2f} s a batch, "
          f"{sampling['rollout_lora']['s']:.2f} s with a LoRA adapter", flush=True)  # fmt: skip
    return {"model": name, "parameters": params, "step_tokens": step_tokens,
            "direct_step_s": direct, "trainer_step_s": trainer,
            "overhead": runs[0]["step_s"] / direct, "trainer_overhead": runs[0]["step_s"] / trainer,
            "runs": runs, "sampling": sampling}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--port", type=int, default=8791)
    args = p.parse_args()
    import torch

    from rlpost.models.tiny import build_tiny_model
    from rlpost.serve.__main__ import BUILTIN, builtin_model

    torch.manual_seed(0)
    small = build_tiny_model("small", Path(tempfile.mkdtemp()) / "small", seed=0)
    models = [measure(BUILTIN, builtin_model(), args.steps, args.port),
              measure("rlpost/tiny-small", str(small), args.steps, args.port)]  # fmt: skip
    lines = [
        f"# rlpost serve: the SDK over HTTP against rlpost's own trainer and rollout, and "
        f"tenants at once ({QUESTIONS} questions a step, LoRA rank {RANK})",
        "",
        f"`python bench/serve_tenants.py --steps {args.steps}`",
        "",
        "| model | how | tenants | s a step (median) | tokens/s, all tenants | steps/s, all "
        "tenants | against one tenant | resident memory |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in models:
        size = f"{m['model']} ({m['parameters'] / 1e6:.1f} M)"
        for how, step_s in (("rlpost's trainer (FSDP2 engine, update_sft)", m["trainer_step_s"]),
                            ("the service's host, called directly", m["direct_step_s"])):  # fmt: skip
            lines.append(f"| {size} | {how} | 1 | {step_s:.3f} | "
                         f"{m['step_tokens'] / step_s:,.0f} | {1 / step_s:.2f} | | |")  # fmt: skip
        one = m["runs"][0]
        for r in m["runs"]:
            lines.append(
                f"| {size} | SDK over HTTP | {r['tenants']} | {r['step_s']:.3f} | "
                f"{r['tokens_per_s']:,.0f} | {r['steps_per_s']:.2f} | "
                f"{r['steps_per_s'] / one['steps_per_s']:.2f}x | {r['rss_gib']:.2f} GiB |"
            )
    lines += [
        "",
        f"Sampling, 16 prompts x {SAMPLES} samples of up to {MAX_TOKENS} tokens at temperature "
        "1, the requests sent at once (s a batch, median of 3 after a warm-up; sampled "
        "tokens a second):",
        "",
        "| model | rlpost's rollout engine (vLLM), base weights | rlpost's rollout engine, "
        "a LoRA adapter | SDK, `--sampler vllm` (LoRA) | SDK, `--sampler model` (LoRA) |",
        "|---|---|---|---|---|",
    ]
    for m in models:
        t = m["sampling"]
        cells = [f"{t[k]['s']:.2f} s, {t[k]['tokens_per_s']:,.0f} tok/s"
                 for k in ("rollout", "rollout_lora", "vllm", "model")]  # fmt: skip
        lines.append(f"| {m['model']} | " + " | ".join(cells) + " |")
    lines.append("")
    for m in models:
        t = m["sampling"]
        lines.append(
            f"The service's overhead on one tenant of {m['model']}: a step **"
            f"{m['trainer_overhead']:.2f}x** rlpost's trainer's ({m['overhead']:.2f}x its own "
            f"host called directly); sampling a tenant's adapter **"
            f"{t['model']['s'] / t['rollout_lora']['s']:.2f}x** (`--sampler model`) and **"
            f"{t['vllm']['s'] / t['rollout_lora']['s']:.2f}x** (`--sampler vllm`) the time of "
            "rlpost's rollout engine sampling an adapter."
        )
    text = "\n".join(lines) + "\n"
    print(text)
    results = ROOT / "bench" / "results"
    result = {"steps": args.steps, "questions": QUESTIONS, "rank": RANK, "models": models}
    (results / "serve_tenants.json").write_text(json.dumps(result, indent=1) + "\n")
    (results / "serve_tenants.md").write_text(text)


if __name__ == "__main__":
    main()
