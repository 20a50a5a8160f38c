#!/usr/bin/env bash
# Submit a training run as a Ray job to a running cluster.
#   RAY_ADDRESS  the cluster's dashboard (Jobs API), default http://127.0.0.1:8265
#   RUN_DIR      where the run writes (absolute; on a filesystem every node
#                shares when trainer ranks run on other nodes), default /tmp/rlpost-job
# Every node needs the same Python environment as this machine (bash install.sh,
# or pip install -e ".[cpu]" / ".[gpu]") and is started from it, e.g.
#   head:   .venv/bin/ray start --head --dashboard-host=0.0.0.0
#   others: .venv/bin/ray start --address=HEAD_IP:6379
# Extra key=value arguments are appended, e.g. trainer.world_size=2 algo=dapo.
set -euo pipefail
cd "$(dirname "$0")/.."
export RAY_ADDRESS="${RAY_ADDRESS:-http://127.0.0.1:8265}"
# `ray start --head` turns Ray's token authentication on and writes the token to
# ~/.ray/auth_token; a client outside the cluster must then say so. Use token mode
# whenever a token is at hand (RAY_AUTH_MODE set by the caller wins).
if [ -z "${RAY_AUTH_MODE:-}" ] && { [ -n "${RAY_AUTH_TOKEN:-}" ] || [ -s "${HOME}/.ray/auth_token" ]; }; then
  export RAY_AUTH_MODE=token
fi
# --working-dir uploads this checkout (minus .gitignore'd files) to the cluster; the job's
# driver and every worker import rlpost from that copy. The job's current directory
# is a temporary copy, hence the absolute run directory. `ray job stop` sends SIGTERM and
# SIGKILLs after RAY_JOB_STOP_WAIT_TIME_S (3 s by default): 600 lets the step in progress
# finish and its checkpoint be written, as the CLI does on SIGTERM.
exec "${RAY:-.venv/bin/ray}" job submit --working-dir . \
    --runtime-env-json '{"excludes": [".git"], "env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": "600"}}' \
    -- python -m rlpost.main algo=grpo trainer.run_dir="${RUN_DIR:-/tmp/rlpost-job}" "$@"
