"""The yardstick for rlpost's policy update on one device: the same model and the
same batch updated by plain torch + transformers, with nothing of rlpost around it.

    python bench/plain_update.py --model DIR --samples 32 --prompt 128 --response 384 \
        --micro-batch 8 [--device cuda] [--out ROWS.json]

What the loop does, as a user would write it in an afternoon: float32 weights
under bf16 autocast (the precision of ``trainer.mixed_precision=bf16``: bf16
matmuls, float32 master weights and optimizer), fused AdamW on CUDA, the
log-softmax of the whole [b, t, v] logits in float32, a PPO-clipped loss over the
response tokens normalised by their count, gradient clipping at 1.0, one
optimizer step per batch. ``bench/gpu_check.py`` runs it beside the FSDP2
engine's update and reports the ratio; a micro-batch that does not fit (the
materialised logits are 2.4 GB per 4k tokens at a 150k vocabulary) is reported
as out of memory, and the check then takes the largest that fits.

Legend: b = samples, t = tokens, v = vocab.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

CLIP = 0.2  # PPO's epsilon, both sides


def batch(samples: int, prompt: int, response: int, vocab: int) -> tuple[torch.Tensor, ...]:
    """Random token ids (b, t), the response mask of the predicted positions
    (b, t - 1) and one advantage per sample (b, 1); seeded, so every caller gets the
    same batch (``bench/gpu_check.py``'s ``update_batch`` draws it the same way)."""
    g = torch.Generator().manual_seed(0)
    total = prompt + response
    ids_bt = torch.randint(5, vocab, (samples, total), generator=g)
    adv_b1 = torch.randn(samples, 1, generator=g)
    mask_bt = torch.zeros(samples, total - 1)
    mask_bt[:, prompt - 1 :] = 1.0  # position t predicts token t + 1
    return ids_bt, mask_bt, adv_b1


def logp_of(model: torch.nn.Module, ids_bt: torch.Tensor, device: str) -> torch.Tensor:
    with torch.autocast(device, torch.bfloat16):
        logits_btv = model(input_ids=ids_bt, use_cache=False).logits[:, :-1]
    return F.log_softmax(logits_btv.float(), -1).gather(-1, ids_bt[:, 1:, None])[..., 0]


def run(
    model_dir: str,
    device: str,
    samples: int,
    prompt: int,
    response: int,
    micro_batch: int,
    updates: int = 2,
) -> dict:
    """Timed optimizer steps (after one warm-up step) of the plain loop; one row."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-6, fused=device == "cuda")
    ids_bt, mask_bt, adv_b1 = (
        x.to(device) for x in batch(samples, prompt, response, model.config.vocab_size)
    )
    mbs = [slice(i, i + micro_batch) for i in range(0, samples, micro_batch)]
    with torch.no_grad():
        old_bt = torch.cat([logp_of(model, ids_bt[s], device) for s in mbs])
    tokens = mask_bt.sum()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model.train()
        for s in mbs:
            ratio_bt = torch.exp(logp_of(model, ids_bt[s], device) - old_bt[s])
            adv = adv_b1[s]
            pg_bt = -torch.min(ratio_bt * adv, ratio_bt.clamp(1 - CLIP, 1 + CLIP) * adv)
            ((pg_bt * mask_bt[s]).sum() / tokens).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    row = {
        "check": "plain_update", "samples": samples, "prompt": prompt, "response": response,
        "micro_batch": micro_batch, "tokens": samples * (prompt + response),
        "params": sum(p.numel() for p in model.parameters()),
    }  # fmt: skip
    try:
        step()  # warm-up: the allocator, cuBLAS's choices
        sync(device)
        reset_peak(device)
        start = time.perf_counter()
        for _ in range(updates):
            step()
        sync(device)
    except torch.OutOfMemoryError:
        row["oom"] = True
        return row  # the caller empties the cache once this frame's tensors are gone
    seconds = (time.perf_counter() - start) / updates
    row.update(oom=False, update_s=seconds, tokens_per_s=row["tokens"] / seconds)
    row["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    return row


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def reset_peak(device: str) -> None:
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="a transformers causal-LM directory")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--response", type=int, default=384)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--updates", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    row = run(a.model, a.device, a.samples, a.prompt, a.response, a.micro_batch, a.updates)
    print(json.dumps(row))
    if a.out:
        a.out.write_text(json.dumps([row], indent=1) + "\n")


if __name__ == "__main__":
    main()
