"""The tinker cookbook's RL recipe, unchanged, against ``rlpost serve`` on this
machine, offline: ``recipes.math_rl.train env=arithmetic renderer_name=role_colon
loss_fn=importance_sampling``, its curve and wall time.

    python bench/cookbook_recipe.py                  # 100 RL steps
    python bench/cookbook_recipe.py --rl-steps 3     # a smoke run
    python bench/cookbook_recipe.py --report         # the table and figure again

The environment asks ``"What is 37 + 48?"`` (operands 0-100) after one worked
example, in the role_colon format::

    User: What is 4 + 5?\\n\\nAssistant: 9\\n\\nUser: What is 37 + 48?\\n\\nAssistant: 85\\n\\nUser:

and rewards a sample 1 for the right sum, minus 0.1 when it does not end with the
stop sequence ``"\\n\\nUser:"``. No hub model runs here, and the built-in model
(~1 M parameters, a character-level tokenizer) was trained on ``"37+48="`` only:
as it ships it answers about 0 of these. So the bench first gives it the format,
in plain torch and outside the service: the shipped arithmetic base that answers
``"37+48="`` right 94 % of the time is fully fine-tuned on such conversations
until its greedy answers are right ``--base-accuracy`` of the time on 256
questions it was not trained on, and saved as a model folder. That base is
served as ``rlpost/tiny-arith-chat`` (``--hf-cache`` puts its tokenizer in a
cache of the bench's own under that name), and the recipe runs as its own process
with the cookbook from ``.cookbook`` (``install.sh``) on ``PYTHONPATH`` and
``HF_HUB_OFFLINE=1``: LoRA rank 32, 16 groups of 8 samples a step.

Reported: the recipe's own ``env/all/correct`` (the fraction of sampled answers
with the right sum, at temperature 1), ``env/all/format`` and reward by step, the
recipe's wall time, and the base's warm-up. Writes
bench/results/cookbook_recipe.json and .md, and docs/images/cookbook-recipe.png.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
COOKBOOK = ROOT / ".cookbook"
RESULTS = ROOT / "bench" / "results"
MODEL = "rlpost/tiny-arith-chat"
FEWSHOT = "User: What is 4 + 5?\n\nAssistant: 9\n\n"  # the environment's worked example
STOP = "\n\nUser:"


def prompt_text(x: int, y: int) -> str:
    """The environment's prompt as role_colon renders it (no BOS: the tokenizer has none)."""
    return f"{FEWSHOT}User: What is {x} + {y}?\n\nAssistant:"


def shipped_adder() -> Path:
    """The shipped base warmed to 0.9 accuracy on the built-in ``"37+48="`` task."""
    from rlpost.config import compose
    from rlpost.models.warmup import SHIPPED_DIR, warmup_key

    path = SHIPPED_DIR / warmup_key(compose(["algo=grpo", "model.warmup.target_accuracy=0.9"]))
    if not (path / "config.json").is_file():
        raise SystemExit(f"the shipped arithmetic base is not at {path}")
    return path


def greedy_accuracy(model, tok, pairs: list[tuple[int, int]]) -> float:
    """Greedy answers that are the right sum followed by the stop sequence."""
    tok.padding_side = "left"
    enc = tok([prompt_text(x, y) for x, y in pairs], return_tensors="pt", padding=True,
              add_special_tokens=False)  # fmt: skip
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=len(STOP) + 4, do_sample=False,
                             pad_token_id=tok.pad_token_id)  # fmt: skip
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=False)
    right = [t.startswith(f" {x + y}{STOP}") for t, (x, y) in zip(texts, pairs)]
    return sum(right) / len(pairs)


def warm_base(out: Path, target: float, lr: float, max_steps: int, batch: int = 64) -> dict:
    """Fully fine-tune the shipped adder on the environment's conversations (the answer
    and stop sequence weighted 1) until its greedy accuracy on 256 held-out questions
    reaches ``target``; save it to ``out``. Returns the warm-up's record."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    rng = random.Random(0)
    held = {(rng.randint(0, 100), rng.randint(0, 100)) for _ in range(256)}
    held_out = sorted(held)
    src = shipped_adder()
    tok = AutoTokenizer.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    start = time.perf_counter()
    curve, step = [(0, greedy_accuracy(model, tok, held_out))], 0
    while curve[-1][1] < target and step < max_steps:
        model.train()
        ids, labels = [], []
        for _ in range(batch):
            x, y = rng.randint(0, 100), rng.randint(0, 100)
            while (x, y) in held:
                x, y = rng.randint(0, 100), rng.randint(0, 100)
            p = tok(prompt_text(x, y), add_special_tokens=False)["input_ids"]
            c = tok(f" {x + y}{STOP}", add_special_tokens=False)["input_ids"]
            ids.append(p + c)
            labels.append([-100] * len(p) + c)
        width = max(map(len, ids))
        input_ids = torch.tensor([s + [tok.pad_token_id] * (width - len(s)) for s in ids])
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in ids])
        target_ids = torch.tensor([s + [-100] * (width - len(s)) for s in labels])
        loss = model(input_ids=input_ids, attention_mask=mask, labels=target_ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step % 25 == 0:
            model.eval()
            curve.append((step, greedy_accuracy(model, tok, held_out)))
            print(f"base warm-up step {step}: loss {loss.item():.3f}, greedy accuracy "
                  f"{curve[-1][1]:.3f}", flush=True)  # fmt: skip
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return {"from": src.name, "steps": step, "lr": lr, "batch": batch, "target": target,
            "greedy_accuracy": curve, "wall_s": time.perf_counter() - start}  # fmt: skip


def start_server(out: Path, base: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(out / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlpost.serve", "--port", str(port), "--state-dir",
         str(out / "state"), "--model", f"{MODEL}={base}", "--hf-cache"],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.monotonic() + 180
    while " on http://" not in (out / "server.log").read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"rlpost serve did not start; see {out / 'server.log'}")
        time.sleep(0.2)
    return proc, f"http://127.0.0.1:{port}"


def recipe(module: str, args: list[str], out: Path, name: str, env: dict[str, str]) -> float:
    """Run the cookbook's ``module`` with ``args``; its wall seconds."""
    start = time.perf_counter()
    with open(out / f"{name}.log", "w") as log:
        proc = subprocess.run([sys.executable, "-m", module, *args], env=env, stdout=log,
                              stderr=subprocess.STDOUT)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"{module} failed ({proc.returncode}); see {out / name}.log")
    return time.perf_counter() - start


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rl-steps", type=int, default=100)
    p.add_argument("--rl-lr", type=float, default=3e-4)
    p.add_argument("--base-accuracy", type=float, default=0.3,
                   help="the served base's greedy accuracy in the format, where its warm-up stops")  # fmt: skip
    p.add_argument("--base-lr", type=float, default=1e-3)
    p.add_argument("--base-max-steps", type=int, default=2000)
    p.add_argument("--max-tokens", type=int, default=12,
                   help="the RL recipe's max_tokens: a character-level tokenizer needs 9 for "
                   "an answer and the stop sequence (its default, 5, is for words)")  # fmt: skip
    p.add_argument("--report", action="store_true",
                   help="rewrite the table and figure from cookbook_recipe.json without running")  # fmt: skip
    args = p.parse_args()
    if args.report:
        print(write(json.loads((RESULTS / "cookbook_recipe.json").read_text())))
        return
    if not (COOKBOOK / "tinker_cookbook").is_dir():
        raise SystemExit(f"the cookbook is not in {COOKBOOK}: run install.sh (COOKBOOK=1)")
    out = ROOT / "bench" / ".runs" / "cookbook"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    base = warm_base(out / "base", args.base_accuracy, args.base_lr, args.base_max_steps)
    env = {**os.environ, "HF_HOME": str(out / "hf"), "TINKER_TELEMETRY": "0",
           "TINKER_API_KEY": "tml-bench", "TQDM_DISABLE": "1"}  # fmt: skip
    client_env = {**env, "PYTHONPATH": str(COOKBOOK), "HF_HUB_OFFLINE": "1"}
    server, url = start_server(out, out / "base", env)
    try:
        rl_s = recipe("tinker_cookbook.recipes.math_rl.train",
                      [f"base_url={url}", f"model_name={MODEL}", "renderer_name=role_colon",
                       "lora_rank=32", "behavior_if_log_dir_exists=delete", "env=arithmetic",
                       "loss_fn=importance_sampling", "groups_per_batch=16", "group_size=8",
                       f"max_tokens={args.max_tokens}", f"learning_rate={args.rl_lr}",
                       f"max_steps={args.rl_steps}", "eval_every=0", "save_every=0",
                       f"log_path={out / 'rl'}"],
                      out, "rl", client_env)  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=60)
    rl = [(r["step"], r["env/all/correct"], r["env/all/format"], r["env/all/reward/total"])
          for r in rows(out / "rl" / "metrics.jsonl") if "env/all/correct" in r]  # fmt: skip
    result = {"rl_steps": args.rl_steps, "rl_lr": args.rl_lr, "max_tokens": args.max_tokens,
              "base_accuracy": args.base_accuracy, "rl_wall_s": rl_s, "rl_correct": rl,
              "base": base}  # fmt: skip
    (RESULTS / "cookbook_recipe.json").write_text(json.dumps(result, indent=1) + "\n")
    print(write(result))


def mean(values: list[float]) -> float:
    return sum(values) / max(1, len(values))


def write(result: dict) -> str:
    """bench/results/cookbook_recipe.md and the docs' figure from ``result``."""
    rl, base = result["rl_correct"], result["base"]
    first, last = mean([r[1] for r in rl[:10]]), mean([r[1] for r in rl[-10:]])
    b = base["greedy_accuracy"]
    lines = [
        "# The tinker cookbook's RL recipe against `rlpost serve` (offline)",
        "",
        f"`python bench/cookbook_recipe.py --rl-steps {result['rl_steps']} --rl-lr "
        f"{result['rl_lr']} --base-accuracy {result['base_accuracy']}`",
        "",
        f'- base: the shipped `"37+48="` adder fully fine-tuned in plain torch on the '
        f"environment's conversations, {base['steps']} steps of {base['batch']} (lr "
        f"{base['lr']}), {base['wall_s']:.0f} s: greedy accuracy on 256 held-out questions "
        f"{b[0][1]:.3f} -> {b[-1][1]:.3f}",
        f"- `recipes.math_rl.train env=arithmetic renderer_name=role_colon "
        f"loss_fn=importance_sampling lora_rank=32` ({result['rl_steps']} steps of 16 x 8 "
        f"samples, max_tokens={result['max_tokens']}, lr {result['rl_lr']}): "
        f"{result['rl_wall_s']:.0f} s; right answers {first:.3f} (mean of the first 10 steps) "
        f"-> {last:.3f} (last 10)",
        "",
        "![The recipe's curve](../../docs/images/cookbook-recipe.png)",
        "",
        "| RL step | right answers (`env/all/correct`) | ended by the stop sequence "
        "(`env/all/format`) | reward |",
        "|---|---|---|---|",
        *(f"| {s} | {c:.3f} | {f:.3f} | {r:.3f} |" for s, c, f, r in rl),
    ]
    text = "\n".join(lines) + "\n"
    (RESULTS / "cookbook_recipe.md").write_text(text)
    plot(result, ROOT / "docs" / "images" / "cookbook-recipe.png")
    return text


def plot(result: dict, path: Path) -> None:
    """The RL recipe's right answers by step (each step's 128 samples, and their mean
    over 10 steps), the base's greedy accuracy marked: the docs' figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rl = result["rl_correct"]
    steps, correct = [r[0] for r in rl], [r[1] for r in rl]
    smooth = [mean(correct[max(0, i - 9) : i + 1]) for i in range(len(correct))]
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=120)
    ax.plot(steps, correct, color="tab:blue", alpha=0.3, label="each step (128 samples)")
    ax.plot(steps, smooth, color="tab:blue", lw=2.2, label="mean of the last 10 steps")
    greedy = result["base"]["greedy_accuracy"][-1][1]
    ax.axhline(greedy, color="black", lw=0.8, ls=":", label=f"the base, greedy ({greedy:.2f})")
    ax.set_ylim(0, 1)
    ax.set_xlabel("RL step (recipes.math_rl.train, unchanged)")
    ax.set_ylabel("right answers, sampled at T=1")
    ax.set_title("tinker cookbook math_rl env=arithmetic against rlpost serve", fontsize=10)
    ax.legend(loc="upper left", frameon=False, fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    main()
