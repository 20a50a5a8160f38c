"""GRPO on two-operand addition, written in plain `tinker` SDK calls, trained by
`rlpost serve` on your own machine.

    rlpost serve &                       # the built-in model, as rlpost/tiny-arith
    TINKER_API_KEY=tml-local python examples/tinker/arith_rl.py --steps 30

Each step: snapshot the weights for sampling, sample a group of answers per
question, score them, centre the rewards in each group, and send the sampled
tokens back with their sampling log-probs and advantages to
``forward_backward(..., "importance_sampling")``, then ``optim_step``. Nothing
here is rlpost's: the same file runs against any Tinker-compatible service
serving the model name it asks for.
"""

from __future__ import annotations

import argparse
import os
import random
import time

import tinker


def questions(
    seed: int, held_out: int = 100
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    pairs = [(a, b) for a in range(100) for b in range(100)]
    random.Random(seed).shuffle(pairs)
    return pairs[held_out:], pairs[:held_out]


def answer(tokenizer, tokens: list[int]) -> str:
    return tokenizer.decode(tokens).split("<|")[0].strip()


def prompt_tokens(tokenizer, a: int, b: int) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": f"{a}+{b}="}],
                                         tokenize=False, add_generation_prompt=True)  # fmt: skip
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def accuracy(sampler, tokenizer, pairs) -> float:
    greedy = tinker.SamplingParams(max_tokens=8, temperature=0.0)
    futures = [sampler.sample(tinker.ModelInput.from_ints(prompt_tokens(tokenizer, a, b)), 1, greedy)
               for a, b in pairs]  # fmt: skip
    return sum(answer(tokenizer, f.result().sequences[0].tokens) == str(a + b)
               for f, (a, b) in zip(futures, pairs, strict=True)) / len(pairs)  # fmt: skip


def train(base_url: str | None, model: str, steps: int, questions_per_step: int = 16,
          group: int = 8, rank: int = 16, lr: float = 5e-4, seed: int = 0,
          eval_every: int = 10) -> list[dict]:  # fmt: skip
    """The training loop; one record per step (and the held-out accuracy before it)."""
    service = tinker.ServiceClient(base_url=base_url)
    training = service.create_lora_training_client(base_model=model, rank=rank, seed=seed).result()
    tokenizer = training.get_tokenizer()
    train_pairs, val_pairs = questions(seed)
    rng = random.Random(seed)
    history = [{"step": 0, "val_accuracy": accuracy(training.save_weights_and_get_sampling_client().result(),
                                                    tokenizer, val_pairs)}]  # fmt: skip
    print(f"step 0: held-out accuracy {history[0]['val_accuracy']:.3f}", flush=True)
    for step in range(1, steps + 1):
        start = time.perf_counter()
        sampler = training.save_weights_and_get_sampling_client().result()
        batch = rng.sample(train_pairs, questions_per_step)
        prompts = [prompt_tokens(tokenizer, a, b) for a, b in batch]
        futures = [  # a seed per request: the same run twice samples the same tokens
            sampler.sample(tinker.ModelInput.from_ints(p), group, tinker.SamplingParams(
                max_tokens=8, temperature=1.0, seed=rng.randrange(1 << 31)))
            for p in prompts
        ]  # fmt: skip
        data, rewards = [], []
        for future, prompt, (a, b) in zip(futures, prompts, batch, strict=True):
            sequences = future.result().sequences
            scores = [float(answer(tokenizer, s.tokens) == str(a + b)) for s in sequences]
            rewards += scores
            mean = sum(scores) / len(scores)
            for s, score in zip(sequences, scores, strict=True):
                if score == mean:
                    continue  # no advantage: nothing to learn from this sample
                tokens = prompt + list(s.tokens)
                n = len(prompt) - 1  # the prompt's positions carry no loss
                data.append(tinker.Datum(
                    model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                    loss_fn_inputs={"target_tokens": tokens[1:],
                                    "logprobs": [0.0] * n + list(s.logprobs),
                                    "advantages": [0.0] * n + [score - mean] * len(s.tokens)},
                ))  # fmt: skip
        if data:
            training.forward_backward(data, "importance_sampling")
            training.optim_step(tinker.AdamParams(learning_rate=lr)).result()
        record = {"step": step, "reward": sum(rewards) / len(rewards), "datums": len(data),
                  "seconds": time.perf_counter() - start}  # fmt: skip
        if step % eval_every == 0 or step == steps:
            record["val_accuracy"] = accuracy(training.save_weights_and_get_sampling_client().result(),
                                              tokenizer, val_pairs)  # fmt: skip
        history.append(record)
        print(f"step {step}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                           for k, v in record.items() if k != "step"), flush=True)  # fmt: skip
    return history


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default=os.environ.get("TINKER_BASE_URL", "http://127.0.0.1:8000"))
    p.add_argument("--model", default="rlpost/tiny-arith")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--lr", type=float, default=5e-4)
    args = p.parse_args()
    train(args.base_url, args.model, args.steps, rank=args.rank, lr=args.lr)


if __name__ == "__main__":
    main()
