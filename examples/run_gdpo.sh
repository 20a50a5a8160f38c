#!/usr/bin/env bash
# GDPO: each named reward normalised within its group; needs several named rewards,
# here the built-in task's correctness and format (reward=arith_multi).
# On the built-in arithmetic task with the built-in tiny model, on the CPU
# (configs/algo/gdpo.yaml). Extra key=value arguments are appended, e.g.
#   bash examples/run_gdpo.sh trainer.total_steps=20
# PYTHON=... picks the interpreter (default: the install script's .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-.venv/bin/python}" -m rlpost.main algo=gdpo reward=arith_multi "$@"
