#!/usr/bin/env bash
# The wheels bench/gpu_check.sh unpacks on a GPU machine that has torch, transformers
# and peft but no package index: megatron-core, for the Megatron engine's CUDA tests.
# Run it where pip reaches an index, then carry bench/.wheels (2.6 MB) to the GPU machine.
#   bash bench/fetch_wheels.sh          # for the GPU machine's Python, 3.12 unless PYVER says
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python}"
# the version the megatron extra pins (pyproject.toml), not a second copy of it
pin=$("$py" -c "import tomllib; print(next(r for r in tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['megatron'] if r.startswith('megatron-core')))")
"$py" -m pip download --quiet --no-deps --only-binary :all: --python-version "${PYVER:-3.12}" \
  --platform manylinux_2_28_x86_64 --dest bench/.wheels "$pin"
ls -l bench/.wheels
