#!/usr/bin/env bash
# The prepared accelerator check (bench/gpu_check.py): the FSDP2 engine's bf16 update
# (tokens/s, MFU), log-prob memory at a 150k vocabulary, and the CUDA-IPC weight
# hand-off, on one CUDA GPU with torch, transformers and peft only (no vLLM, no Ray).
# About 3-5 minutes on an H100-class GPU; a hard limit of 8. Results go to $OUT (the
# device machine's result folder) when it is set, else bench/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
python - <<'PY'
import torch, transformers, peft  # noqa: F401
assert torch.cuda.is_available(), "bench/gpu_check.sh needs a CUDA GPU"
print("torch", torch.__version__, "on", torch.cuda.get_device_name(), flush=True)
PY
out="${OUT:-bench/results}"
mkdir -p "$out"
timeout 480 python bench/gpu_check.py --device cuda --out "$out/gpu_check" "$@"
