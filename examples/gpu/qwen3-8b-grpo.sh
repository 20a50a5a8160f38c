#!/usr/bin/env bash
# NEEDS GPUS: one node with 8 CUDA GPUs of 80 GB (4 FSDP ranks, 4 vLLM replicas).
# GRPO on Qwen3-8B (from the Hugging Face hub, or a local directory in MODEL)
# on the built-in arithmetic task with larger operands; bf16 weights, activation
# checkpointing. On a Ray cluster submit it as a job (examples/ray_job.sh shows
# how) with an absolute trainer.run_dir on a shared filesystem.
# Install: pip install -e ".[gpu]". Extra key=value arguments are appended.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec "${PYTHON:-python}" -m rlpost.main algo=grpo \
    model.path="${MODEL:-Qwen/Qwen3-8B}" model.dtype=bfloat16 model.gradient_checkpointing=true \
    trainer.device=cuda trainer.world_size=4 trainer.lr=1e-6 trainer.micro_batch_size=4 \
    trainer.total_steps=200 trainer.val_every=20 \
    data.max_operand=9999 data.prompts_per_step=128 data.val_size=500 data.max_prompt_tokens=256 \
    rollout.replicas=4 rollout.n=8 rollout.max_tokens=1024 rollout.max_model_len=2048 \
    rollout.gpu_memory_utilization=0.85 rollout.enforce_eager=false \
    "$@"
