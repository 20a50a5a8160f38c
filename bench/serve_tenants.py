"""``rlpost serve``: what the service costs over calling its model host directly,
and what tenants sharing one base model get.

    python bench/serve_tenants.py               # 12 timed steps a tenant, 3 warm-up
    python bench/serve_tenants.py --steps 4     # a smoke run

Two base models, one after the other: the built-in one (~1 M parameters, where
a step is short and the service's fixed cost shows) and the ``small`` tiny
preset (~30 M parameters, random weights: only the time is of interest).

A step is one supervised update of a LoRA adapter (rank 16): ``forward_backward(cross_entropy)`` on 32 addition questions with their
answers (``"37+48="`` -> ``"85"``, the answer and end token weighted 1), then
``optim_step``. It is timed three ways:

- **direct**: the model host the server runs (``rlpost.serve.host.ModelHost``),
  its own ``forward_backward`` and ``optim_step`` called in this process, no server;
- **SDK, 1 tenant**: the official ``tinker`` SDK in this process, against
  ``rlpost serve`` running as its own process (as it runs for users), the step's
  two calls sent together and both waited for;
- **SDK, 2 and 4 tenants**: as many clients on threads, each its own adapter,
  stepping at once.

Reported: seconds a step (median over the timed steps), the service's overhead
(SDK over direct), the steps a second all tenants make together, and the
process's resident memory with every tenant made (one base model, an adapter and
its AdamW moments per tenant: the server's process).

Then sampling as an RL step asks for it: 16 prompts x 8 samples of up to 16
tokens from a tenant's snapshot (``train_unembed=False``, so either sampler
serves it), the 16 requests sent at once, by ``--sampler model`` and by
``--sampler vllm`` (a server of each), seconds per batch (median of 3 after one
warm-up). Writes bench/results/serve_tenants.json and .md.
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


def sdk_steps(url: str, model: str, data, tenants: int, steps: int) -> dict:
    import tinker

    datums = [tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens),
                           loss_fn_inputs={"target_tokens": targets, "weights": weights})
              for tokens, targets, weights in data]  # fmt: skip
    service = tinker.ServiceClient(base_url=url)
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
            "loss_first_last": [[ls[0], ls[-1]] for ls in losses]}  # fmt: skip


def sdk_sampling(url: str, model: str, prompts: list[list[int]]) -> float:
    import tinker

    service = tinker.ServiceClient(base_url=url)
    training = service.create_lora_training_client(base_model=model, rank=RANK, seed=0,
                                                   train_unembed=False).result()  # fmt: skip
    sampler = training.save_weights_and_get_sampling_client().result()
    times = []
    for rep in range(4):
        params = tinker.SamplingParams(max_tokens=16, temperature=1.0, seed=rep)
        start = time.perf_counter()
        pending = [sampler.sample(prompt=tinker.ModelInput.from_ints(p), num_samples=8,
                                  sampling_params=params) for p in prompts]  # fmt: skip
        for f in pending:
            f.result()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


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


def measure(name: str, path: str, steps: int, port: int) -> dict:
    from rlpost.serve.host import ModelHost

    state = Path(tempfile.mkdtemp(prefix="rlpost-serve-bench-"))
    host = ModelHost(name, path, state)
    params = sum(p.numel() for p in host.model.parameters())  # the base model's
    data = rows(host.tokenizer)
    direct = statistics.median(direct_steps(host, data, steps))
    del host
    print(f"{name}: direct {direct:.3f} s a step", flush=True)
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
        print(f"{name}: sampling by {sampler}: {sampling[sampler]:.2f} s a batch", flush=True)
    return {"model": name, "parameters": params, "direct_step_s": direct,
            "overhead": runs[0]["step_s"] / direct, "runs": runs,
            "sampling_s": sampling}  # fmt: skip


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
        f"# rlpost serve: the SDK over HTTP against the host called directly, and tenants "
        f"at once ({QUESTIONS} questions a step, LoRA rank {RANK})",
        "",
        f"`python bench/serve_tenants.py --steps {args.steps}`",
        "",
        "| model | how | tenants | s a step (median) | steps/s, all tenants | against one tenant | resident memory |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in models:
        size = f"{m['model']} ({m['parameters'] / 1e6:.1f} M)"
        lines.append(f"| {size} | direct (no server) | 1 | {m['direct_step_s']:.3f} | "
                     f"{1 / m['direct_step_s']:.2f} | | |")  # fmt: skip
        one = m["runs"][0]
        for r in m["runs"]:
            lines.append(
                f"| {size} | SDK over HTTP | {r['tenants']} | {r['step_s']:.3f} | "
                f"{r['steps_per_s']:.2f} | {r['steps_per_s'] / one['steps_per_s']:.2f}x | "
                f"{r['rss_gib']:.2f} GiB |"
            )
    lines += [
        "",
        "Sampling, 16 prompts x 8 samples of up to 16 tokens, the requests sent at once "
        "(s a batch, median of 3):",
        "",
        "| model | --sampler model | --sampler vllm |",
        "|---|---|---|",
    ]
    for m in models:
        t = m["sampling_s"]
        lines.append(f"| {m['model']} | {t['model']:.2f} | {t['vllm']:.2f} |")
    lines.append("")
    lines += [f"The service's overhead on one tenant of {m['model']}: **{m['overhead']:.2f}x** "
              "the direct step." for m in models]  # fmt: skip
    text = "\n".join(lines) + "\n"
    print(text)
    results = ROOT / "bench" / "results"
    result = {"steps": args.steps, "questions": QUESTIONS, "rank": RANK, "models": models}
    (results / "serve_tenants.json").write_text(json.dumps(result, indent=1) + "\n")
    (results / "serve_tenants.md").write_text(text)


if __name__ == "__main__":
    main()
