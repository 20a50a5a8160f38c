"""The tinker cookbook's recipes, unchanged, against ``rlpost serve`` on this
machine, offline: supervised learning with ``recipes.chat_sl.train`` on
conversations in the arithmetic environment's format, then RL with
``recipes.math_rl.train env=arithmetic`` from that checkpoint.

    python bench/cookbook_recipe.py                              # 640 SL, 30 RL steps
    python bench/cookbook_recipe.py --sl-steps 3 --rl-steps 3    # a smoke run

The server serves the built-in model (``rlpost/tiny-arith``, ~1 M parameters,
pre-warmed on ``"37+48="`` questions) and puts its tokenizer in a Hugging Face
cache of the bench's own under that name (``--hf-cache``); both recipes run as
their own processes with the cookbook from ``.cookbook`` (``install.sh``) on
``PYTHONPATH`` and ``HF_HUB_OFFLINE=1``, ``renderer_name=role_colon``.

The environment asks ``"What is 37 + 48?"`` after one worked example, operands
0-100: a format the built-in model was not trained on (about 0 right as it
ships). The supervised recipe teaches the format on 4,096 such conversations
(the worked example and a question with its answer); the RL recipe then
trains with ``loss_fn=importance_sampling`` on 16 groups of 8 samples a step.
Reported: the RL recipe's own ``env/all/correct`` (the fraction of samples with
the right sum) by step, the supervised loss by step, and each recipe's wall
time. Writes bench/results/cookbook_recipe.json and .md.
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

ROOT = Path(__file__).resolve().parents[1]
COOKBOOK = ROOT / ".cookbook"
MODEL = "rlpost/tiny-arith"
ROWS = 4096  # conversations in the supervised data (an epoch: 64 steps of 64)
FEWSHOT = [{"role": "user", "content": "What is 4 + 5?"}, {"role": "assistant", "content": "9"}]


def write_conversations(path: Path, rows: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(rows):
            x, y = rng.randint(0, 100), rng.randint(0, 100)
            messages = [*FEWSHOT, {"role": "user", "content": f"What is {x} + {y}?"},
                        {"role": "assistant", "content": str(x + y)}]  # fmt: skip
            f.write(json.dumps({"messages": messages}) + "\n")


def start_server(out: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(out / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlpost.serve", "--port", str(port), "--state-dir",
         str(out / "state"), "--hf-cache"],
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
    p.add_argument("--sl-steps", type=int, default=640)
    p.add_argument("--rl-steps", type=int, default=30)
    p.add_argument("--sl-lr", type=float, default=3e-3)
    p.add_argument("--rl-lr", type=float, default=1e-3)
    p.add_argument("--max-tokens", type=int, default=12,
                   help="the RL recipe's max_tokens: a character-level tokenizer needs 9 for "
                   "an answer and the stop sequence (its default, 5, is for words)")  # fmt: skip
    args = p.parse_args()
    if not (COOKBOOK / "tinker_cookbook").is_dir():
        raise SystemExit(f"the cookbook is not in {COOKBOOK}: run install.sh (COOKBOOK=1)")
    out = ROOT / "bench" / ".runs" / "cookbook"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    data = out / "arith_conversations.jsonl"
    write_conversations(data, ROWS)
    env = {**os.environ, "HF_HOME": str(out / "hf"), "TINKER_TELEMETRY": "0",
           "TINKER_API_KEY": "tml-bench", "TQDM_DISABLE": "1"}  # fmt: skip
    client_env = {**env, "PYTHONPATH": str(COOKBOOK), "HF_HUB_OFFLINE": "1"}
    server, url = start_server(out, env)
    try:
        common = [f"base_url={url}", f"model_name={MODEL}", "renderer_name=role_colon",
                  "lora_rank=32", "behavior_if_log_dir_exists=delete"]  # fmt: skip
        sl_s = recipe("tinker_cookbook.recipes.chat_sl.train",
                      [*common, f"dataset={data}", f"log_path={out / 'sl'}", "batch_size=64",
                       f"learning_rate={args.sl_lr}", f"max_steps={args.sl_steps}",
                       f"num_epochs={-(-args.sl_steps * 64 // ROWS)}",
                       "save_every=0", "eval_every=0", "infrequent_eval_every=0"],
                      out, "sl", client_env)  # fmt: skip
        state = rows(out / "sl" / "checkpoints.jsonl")[-1]["state_path"]
        rl_s = recipe("tinker_cookbook.recipes.math_rl.train",
                      [*common, "env=arithmetic", "loss_fn=importance_sampling",
                       f"load_checkpoint_path={state}", "groups_per_batch=16", "group_size=8",
                       f"max_tokens={args.max_tokens}", f"learning_rate={args.rl_lr}",
                       f"max_steps={args.rl_steps}", "eval_every=0", "save_every=0",
                       f"log_path={out / 'rl'}"],
                      out, "rl", client_env)  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=60)
    sl = [(r["step"], r["train_mean_nll"]) for r in rows(out / "sl" / "metrics.jsonl")
          if "train_mean_nll" in r]  # fmt: skip
    rl = [(r["step"], r["env/all/correct"], r["env/all/format"], r["env/all/reward/total"])
          for r in rows(out / "rl" / "metrics.jsonl") if "env/all/correct" in r]  # fmt: skip
    result = {"sl_steps": args.sl_steps, "rl_steps": args.rl_steps, "sl_lr": args.sl_lr,
              "max_tokens": args.max_tokens,
              "rl_lr": args.rl_lr, "sl_wall_s": sl_s, "rl_wall_s": rl_s, "sl_nll": sl,
              "rl_correct": rl}  # fmt: skip
    first = sum(r[1] for r in rl[:5]) / max(1, len(rl[:5]))
    last = sum(r[1] for r in rl[-5:]) / max(1, len(rl[-5:]))
    result["rl_correct_first5"], result["rl_correct_last5"] = first, last
    lines = [
        "# The tinker cookbook's recipes against `rlpost serve` (built-in model, offline)",
        "",
        f"`python bench/cookbook_recipe.py --sl-steps {args.sl_steps} --rl-steps {args.rl_steps}`",
        "",
        f"- `recipes.chat_sl.train` ({args.sl_steps} steps of 64 conversations, lr "
        f"{args.sl_lr}): {sl_s:.0f} s; train NLL {sl[0][1]:.3f} -> {sl[-1][1]:.3f}",
        f"- `recipes.math_rl.train env=arithmetic loss_fn=importance_sampling` from that "
        f"checkpoint ({args.rl_steps} steps of 16 x 8 samples, max_tokens={args.max_tokens}, "
        f"lr {args.rl_lr}): {rl_s:.0f} s; "
        f"right answers {first:.3f} (mean of the first 5 steps) -> {last:.3f} (last 5)",
        "",
        "| RL step | right answers (`env/all/correct`) | ended by the stop sequence "
        "(`env/all/format`) | reward |",
        "|---|---|---|---|",
        *(f"| {s} | {c:.3f} | {f:.3f} | {r:.3f} |" for s, c, f, r in rl),
    ]
    text = "\n".join(lines) + "\n"
    results = ROOT / "bench" / "results"
    (results / "cookbook_recipe.json").write_text(json.dumps(result, indent=1) + "\n")
    (results / "cookbook_recipe.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
