#!/usr/bin/env bash
# REINFORCE++: discounted returns whitened over the batch, KL penalty to the reference.
# On the built-in arithmetic task with the built-in tiny model, on the CPU
# (configs/algo/reinforce_pp.yaml). Extra key=value arguments are appended, e.g.
#   bash examples/run_reinforce_pp.sh trainer.total_steps=20
# PYTHON=... picks the interpreter (default: the install script's .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-.venv/bin/python}" -m rlpost.main algo=reinforce_pp "$@"
