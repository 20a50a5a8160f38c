#!/usr/bin/env bash
# The GPU acceptance check, on one CUDA GPU with torch, transformers and peft only (no
# vLLM, Ray, omegaconf or hydra), in at most six minutes:
#   1. `pytest -m gpu` over the engine tests that run on one device (their `cuda`
#      cases: FSDP2 full, LoRA, critic, reward model, SFT, DPO, checkpoints, export,
#      weight stream, packing and offload, bf16; the collectives and the IPC buckets;
#      the compiled log-prob kernels against the eager ones; the Megatron engine and
#      critic at tp = 1, when megatron-core is there or its wheel was carried in
#      bench/.wheels: `bash bench/fetch_wheels.sh` where an index is reachable);
#   2. bench/gpu_check.py: the FSDP2 update beside a plain torch + transformers loop at
#      two shapes, log-prob memory and time at a 150k vocabulary, the CUDA-IPC hand-off,
#      and last, while its time budget lasts, the update with compiled decoder layers
#      and log-prob kernels (trainer.compile).
# Every result goes to $OUT (the device machine's result folder) when it is set, else
# bench/results/ (bench/.runs/ with --device cpu); the summary table is printed last.
#   bash bench/gpu_check.sh                      # on the GPU machine
#   PYTHON=.venv/bin/python bash bench/gpu_check.sh --device cpu --small  # the code, on the CPU (CI)
set -uo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python}"  # the interpreter with torch, transformers and peft
device=cuda
for arg in "$@"; do [ "$arg" = cpu ] && device=cpu; done
# a CPU run's figures are not the GPU's: they go beside the other local runs
if [ "$device" = cuda ]; then out="${OUT:-bench/results}"; else out="${OUT:-bench/.runs}"; fi
mkdir -p "$out"
# groups run side by side (one NCCL rank each, tiny models); compiling has one of its own
TEST_GROUPS=(
  "tests/unit/test_collective_devices.py tests/unit/test_ipc_buckets.py tests/integration/test_fsdp_engine.py"
  "tests/integration/test_lora.py tests/integration/test_critic_and_kl.py tests/integration/test_preference_engines.py"
  "tests/integration/test_checkpoint.py tests/integration/test_export.py"
  "tests/integration/test_single_pass_update.py tests/integration/test_packing.py tests/unit/test_logprobs.py"
  "tests/integration/test_compiled_layers.py"
)
MEGATRON_GROUP="tests/integration/test_megatron_engine.py tests/integration/test_megatron_critic.py"
tests=()
if [ "$device" = cuda ]; then
  # megatron-core is not on the GPU machine and it has no index: a carried wheel is
  # unpacked (it needs only torch, numpy and packaging) and put first on the path
  if "$py" -c "import megatron.core" > /dev/null 2>&1; then
    TEST_GROUPS+=("$MEGATRON_GROUP")
  elif wheel=$(ls bench/.wheels/megatron_core-*.whl 2> /dev/null | head -n 1) && [ -n "$wheel" ]; then
    site="$(mktemp -d)"
    "$py" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$wheel" "$site"
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    echo "megatron-core from $wheel"
    TEST_GROUPS+=("$MEGATRON_GROUP")
  else
    echo "megatron-core: not installed and no wheel in bench/.wheels (bash bench/fetch_wheels.sh): the Megatron engine's GPU tests do not run"
  fi
  "$py" - <<'PY' || exit 1
import torch, transformers, peft
assert torch.cuda.is_available(), "bench/gpu_check.sh needs a CUDA GPU (or --device cpu --small)"
print("torch", torch.__version__, "transformers", transformers.__version__, "peft",
      peft.__version__, "on", torch.cuda.get_device_name(), flush=True)
PY
  start=$(date +%s)
  for i in "${!TEST_GROUPS[@]}"; do
    # shellcheck disable=SC2086  # a group is a list of paths
    timeout 180 "$py" -m pytest -q -m gpu -p no:cacheprovider -o addopts="" \
      --junitxml "$out/gpu_tests_$i.xml" ${TEST_GROUPS[$i]} > "$out/gpu_tests_$i.log" 2>&1 &
  done
  wait
  echo "pytest -m gpu: $(( $(date +%s) - start )) s"
  for i in "${!TEST_GROUPS[@]}"; do
    tail -n 1 "$out/gpu_tests_$i.log"
    tests+=(--tests "$out/gpu_tests_$i.xml")
  done
fi
timeout 280 "$py" bench/gpu_check.py --device "$device" --out "$out/gpu_check" \
  ${tests[@]+"${tests[@]}"} "$@"
