#!/usr/bin/env bash
# NEEDS GPUS: 2 CUDA GPUs (one FSDP rank, one vLLM replica), about 40 GB each.
# GRPO on MATH with Qwen2.5-1.5B-Instruct (MODEL=Qwen/Qwen2.5-0.5B-Instruct for
# the smaller one; a local directory works too). Prepare the data first:
#   python examples/recipes/math/prepare.py <hub files of a MATH dataset> data/math
# Rewards: math (the last \boxed{} checked for equivalence with math-verify,
# pip install 'rlpost[math]') weighted 1.0, think_format 0 by default (raise
# reward.weights.think_format for a reasoning template).
# Expected curve (NOT RUN HERE, no GPU was at hand): val/reward_mean (the
# greedy test accuracy, as the math score is 0 or 1) should rise over the first
# ~100 steps; the Qwen2.5 report puts the 1.5B instruct model near 55 % on MATH
# before any RL, so expect a rise of a few points from there.
# Then evaluate with pass@k:
#   python -m rlpost.eval model.path=outputs/math/final data=files \
#     data.val_files=[data/math/test.parquet] reward.fn=math eval.n=16 eval.k=[1,4,16]
# Extra key=value arguments are appended.
set -euo pipefail
cd "$(dirname "$0")/../../.."
DATA="${DATA:-data/math}"
exec "${PYTHON:-python}" -m rlpost.main algo=grpo \
    model.path="${MODEL:-Qwen/Qwen2.5-1.5B-Instruct}" model.dtype=bfloat16 \
    data=files data.train_files="[$DATA/train.parquet]" data.val_files="[$DATA/test.parquet]" \
    data.prompts_per_step=64 data.val_size=500 data.max_prompt_tokens=512 \
    reward=custom reward.fn="[math,think_format]" \
    reward.weights.math=1.0 reward.weights.think_format=0.0 reward.timeout_s=20 \
    trainer.device=cuda trainer.world_size=1 trainer.lr=1e-6 trainer.micro_batch_size=8 \
    trainer.total_steps=200 trainer.val_every=20 trainer.log_samples=8 \
    trainer.run_dir="${RUN_DIR:-outputs/math}" \
    rollout.n=8 rollout.max_tokens=1024 rollout.max_model_len=2048 rollout.temperature=1.0 \
    rollout.gpu_memory_utilization=0.6 rollout.enforce_eager=false \
    "$@"
