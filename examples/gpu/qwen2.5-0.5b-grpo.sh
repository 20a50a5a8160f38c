#!/usr/bin/env bash
# NEEDS GPUS: 2 CUDA GPUs (one FSDP rank, one vLLM replica), about 24 GB each.
# GRPO on Qwen2.5-0.5B-Instruct (downloaded from the Hugging Face hub, or a
# local directory in MODEL) on the built-in arithmetic task with larger
# operands. The reward accepts only the bare sum before the end token, so the
# run teaches the model the answer format as well as the arithmetic.
# Install: pip install -e ".[gpu]". Extra key=value arguments are appended;
# for your own data add e.g.
#   data=files data.train_files=[train.jsonl] data.val_files=[val.jsonl] \
#   reward=custom reward.fn=my_reward.py:score
set -euo pipefail
cd "$(dirname "$0")/../.."
exec "${PYTHON:-python}" -m rlpost.main algo=grpo \
    model.path="${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}" model.dtype=bfloat16 \
    trainer.device=cuda trainer.world_size=1 trainer.lr=1e-6 trainer.micro_batch_size=16 \
    trainer.total_steps=200 trainer.val_every=20 \
    data.max_operand=999 data.prompts_per_step=64 data.val_size=500 data.max_prompt_tokens=128 \
    rollout.n=8 rollout.max_tokens=256 rollout.max_model_len=1024 rollout.temperature=1.0 \
    rollout.gpu_memory_utilization=0.6 rollout.enforce_eager=false \
    "$@"
