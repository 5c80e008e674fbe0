from __future__ import annotations

import os
from pathlib import Path

import pytest

from gapprune.serving.vllm_runtime import VllmEnvironment, find_vllm
from tests.conftest import skip_or_fail

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def vllm_env() -> VllmEnvironment:
    """vLLM's interpreter: $GAPPRUNE_VLLM_PYTHON, else the checkout's .venv-vllm (`scripts/setup_vllm.sh`)."""
    local = REPO / ".venv-vllm" / "bin" / "python"
    try:
        return find_vllm(None if os.environ.get("GAPPRUNE_VLLM_PYTHON") or not local.exists() else str(local))
    except ValueError as err:
        skip_or_fail(f"vLLM is not available: {err}")
        raise
