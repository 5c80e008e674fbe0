from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from gapprune.serving.vllm_runtime import VllmEnvironment, find_vllm
from tests.conftest import FAMILIES, skip_or_fail

REPO = Path(__file__).resolve().parents[2]
MODEL_CLASSES = {family: type(build()) for family, build in FAMILIES.items()}


def servable_tiny(family: str) -> torch.nn.Module:
    """The suite's tiny model of `family` with heads of 32: vLLM's CPU attention has no kernel for 16."""
    config = copy.deepcopy(FAMILIES[family]().config)
    config.hidden_size, config.head_dim = 128, 32
    if family == "gemma3":
        config.query_pre_attn_scalar = 32
    torch.manual_seed(0)
    model = MODEL_CLASSES[family](config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(-0.5, 0.5)  # act on every norm (Gemma's are 1 + weight, zero at init)
    return model


@pytest.fixture(scope="session")
def vllm_env() -> VllmEnvironment:
    """vLLM's interpreter: $GAPPRUNE_VLLM_PYTHON, else the checkout's .venv-vllm (`scripts/setup_vllm.sh`)."""
    local = REPO / ".venv-vllm" / "bin" / "python"
    try:
        return find_vllm(None if os.environ.get("GAPPRUNE_VLLM_PYTHON") or not local.exists() else str(local))
    except ValueError as err:
        skip_or_fail(f"vLLM is not available: {err}")
        raise


@pytest.fixture(scope="session")
def servable_folder(tiny_model_folder, tmp_path_factory):
    """A tiny Llama with heads of 32 (vLLM's CPU attention has none of 16) and the suite's real tokenizer."""
    folder, text = tiny_model_folder
    out = tmp_path_factory.mktemp("servable") / "model"
    model = servable_tiny("llama")
    model.resize_token_embeddings(json.loads((folder / "config.json").read_text())["vocab_size"])
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(folder / name, out / name)
    return out, text
