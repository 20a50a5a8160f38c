#!/usr/bin/env bash
# GRPO: group-normalised advantages, clipped PPO surrogate, token-mean loss.
# On the built-in arithmetic task with the built-in tiny model, on the CPU
# (configs/algo/grpo.yaml). Extra key=value arguments are appended, e.g.
#   bash examples/run_grpo.sh trainer.total_steps=20
# PYTHON=... picks the interpreter (default: the install script's .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-.venv/bin/python}" -m rlpost.main algo=grpo "$@"
