#!/usr/bin/env bash
# PPO: critic with GAE advantages and a KL penalty to the initial policy in the reward
# (three trainer groups: policy, critic, reference).
# On the built-in arithmetic task with the built-in tiny model, on the CPU
# (configs/algo/ppo.yaml). Extra key=value arguments are appended, e.g.
#   bash examples/run_ppo.sh trainer.total_steps=20
# PYTHON=... picks the interpreter (default: the install script's .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-.venv/bin/python}" -m rlpost.main algo=ppo "$@"
