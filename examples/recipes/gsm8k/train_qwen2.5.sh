#!/usr/bin/env bash
# NEEDS GPUS: 2 CUDA GPUs (one FSDP rank, one vLLM replica), about 24 GB each.
# GRPO on GSM8K with Qwen2.5-0.5B-Instruct (MODEL=Qwen/Qwen2.5-1.5B-Instruct for
# the larger one; a local directory works too). Prepare the data first:
#   python examples/recipes/gsm8k/prepare.py <hub files of openai/gsm8k> data/gsm8k
# Rewards: gsm8k (the number after ####, strict) weighted 1.0 and its flexible
# variant (the last number) 0.1, so early completions that forget the ####
# still get a signal.
# Expected curve (NOT RUN HERE, no GPU was at hand): val/accuracy is not logged
# (the rewards have no 'correctness'); val/reward_mean, strict gsm8k plus 0.1 x
# flexible, should rise over the first ~100 steps and flatten. For scale, verl's
# quick start reports Qwen2.5-0.5B-Instruct going from 36.4 % to 56.7 % on the
# GSM8K test set with PPO; expect a rise of that order, higher for 1.5B.
# Then evaluate:
#   python -m rlpost.eval model.path=outputs/gsm8k/final data=files \
#     data.val_files=[data/gsm8k/test.parquet] reward.fn=gsm8k eval.n=16 eval.k=[1,4,16]
# Extra key=value arguments are appended.
set -euo pipefail
cd "$(dirname "$0")/../../.."
DATA="${DATA:-data/gsm8k}"
exec "${PYTHON:-python}" -m rlpost.main algo=grpo \
    model.path="${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}" model.dtype=bfloat16 \
    data=files data.train_files="[$DATA/train.parquet]" data.val_files="[$DATA/test.parquet]" \
    data.prompts_per_step=64 data.val_size=500 data.max_prompt_tokens=384 \
    reward=custom reward.fn="[gsm8k,gsm8k_flexible]" \
    reward.weights.gsm8k=1.0 reward.weights.gsm8k_flexible=0.1 \
    trainer.device=cuda trainer.world_size=1 trainer.lr=1e-6 trainer.micro_batch_size=16 \
    trainer.total_steps=200 trainer.val_every=20 trainer.log_samples=8 \
    trainer.run_dir="${RUN_DIR:-outputs/gsm8k}" \
    rollout.n=8 rollout.max_tokens=512 rollout.max_model_len=1024 rollout.temperature=1.0 \
    rollout.gpu_memory_utilization=0.6 rollout.enforce_eager=false \
    "$@"
