"""LoRA vs full fine-tuning and packed vs padded micro-batches on the FSDP2 engine.

    python bench/trainer_features.py        # writes bench/results/trainer_features.md

The "tiny" preset (the default policy), one rank on the CPU, a GRPO-style
batch of 64 samples with mixed lengths (prompts 8-24 tokens, responses 1-48).
Step time is the median of 5 ``update_policy`` calls after one warm-up call.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlpost.algos import PolicyLossConfig  # noqa: E402
from rlpost.models.tiny import build_tiny_model  # noqa: E402
from rlpost.trainers.batch import TrajectoryBatch, pad_sequences  # noqa: E402
from rlpost.trainers.fsdp.engine import FSDPEngine, FSDPEngineConfig  # noqa: E402
from rlpost.trainers.fsdp.lora import LoraSettings  # noqa: E402

ROWS = {
    "full, padded": {},
    "LoRA r=8, padded": {"lora": LoraSettings(rank=8)},
    "full, packed": {"packing": True},
    "LoRA r=8, packed": {"lora": LoraSettings(rank=8), "packing": True},
}


def batch(n: int = 64) -> TrajectoryBatch:
    g = torch.Generator().manual_seed(0)
    ids, resp = [], []
    for _ in range(n):
        p = int(torch.randint(8, 25, (1,), generator=g))
        r = int(torch.randint(1, 49, (1,), generator=g))
        ids.append(torch.randint(5, 100, (p + r,), generator=g).tolist())
        resp.append([0] * p + [1] * r)
    b = TrajectoryBatch(
        input_ids_bt=pad_sequences(ids, 0),
        attention_mask_bt=pad_sequences([[1] * len(s) for s in ids], 0),
        response_mask_bt=pad_sequences(resp, 0),
    )
    b.advantages_bt = torch.randn(n, 1, generator=g) * b.response_mask_bt
    return b


def main() -> None:
    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp())
    model = str(build_tiny_model("tiny", tmp / "m", seed=0))
    b = batch()
    real = int(b.attention_mask_bt.sum())
    lines = [
        f"tiny preset, 64 samples, {real} tokens ({b.input_ids_bt.numel()} padded), 1 CPU thread",
        "",
        "| setting | trainable params | optimizer state | step time (s) |",
        "| --- | --- | --- | --- |",
    ]
    for name, kw in ROWS.items():
        cfg = FSDPEngineConfig(
            model_path=model, micro_batch_size=16, lr=1e-4, lr_warmup_steps=0, **kw
        )
        eng = FSDPEngine(cfg, 0, 1, "tcp://127.0.0.1:29581")
        b.old_logp_bt = eng.logprobs(b)
        times = []
        for i in range(6):
            start = time.perf_counter()
            eng.update_policy(b, PolicyLossConfig())
            if i:
                times.append(time.perf_counter() - start)
        opt = eng.updater.optimizer  # type: ignore[union-attr]
        state = sum(
            v.numel() * v.element_size()
            for s in opt.state.values()
            for v in s.values()
            if torch.is_tensor(v)
        )
        lines.append(
            f"| {name} | {eng.num_trainable:,} of {eng.num_params:,} | {state / 2**20:.2f} MiB "
            f"| {statistics.median(times):.3f} |"
        )
        del eng
    text = "\n".join(lines)
    print(text)
    out = Path(__file__).parent / "results" / "trainer_features.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text(text + "\n")


if __name__ == "__main__":
    main()
