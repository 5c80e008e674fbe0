from __future__ import annotations

import os

import pytest

from gapprune.serving.vllm_runtime import VllmEnvironment, find_vllm

STRICT_ENV = "GAPPRUNE_STRICT"  # set by .ci/run: a test that cannot run there fails instead of skipping


def skip_or_fail(reason: str) -> None:
    if os.environ.get(STRICT_ENV):
        pytest.fail(f"{reason} (and ${STRICT_ENV} is set, so this cannot be skipped)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def vllm_env() -> VllmEnvironment:
    """vLLM's interpreter from $GAPPRUNE_VLLM_PYTHON (`scripts/setup.sh` makes .venv-vllm and CI sets it)."""
    try:
        return find_vllm()
    except ValueError as err:
        skip_or_fail(f"vLLM is not available: {err}")
        raise
