#!/usr/bin/env bash
# RLOO: each sample's baseline is the mean score of the other samples of its prompt.
# On the built-in arithmetic task with the built-in tiny model, on the CPU
# (configs/algo/rloo.yaml). Extra key=value arguments are appended, e.g.
#   bash examples/run_rloo.sh trainer.total_steps=20
# PYTHON=... picks the interpreter (default: the install script's .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-.venv/bin/python}" -m rlpost.main algo=rloo "$@"
