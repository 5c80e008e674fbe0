"""The core contracts again on CUDA (skipped without a GPU; run with `pytest -m gpu tests/gpu`).

They call the same functions as the bf16 CPU tests (tests/precision/contracts.py). Until a GPU
machine runs them they are unrun: see docs/performance.md, "GPU check".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import tiny_llama, tiny_qwen2
from tests.precision.contracts import (
    IDS,
    as_dtype,
    batched_equals_reference,
    default_plan,
    kept_units,
    logits,
    removal_equals_masking,
    save_reload_same_logits,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2])
def test_removal_equals_masking_on_cuda(make, dtype):
    removal_equals_masking(as_dtype(make(), dtype, "cuda"), IDS, atol=1e-4 if dtype == torch.float32 else 2e-2)


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2])
def test_batched_table_equals_reference_table_on_cuda(make):
    batched_equals_reference(as_dtype(make(), torch.float32, "cuda"), IDS, rtol=1e-3, atol=1e-5)


def test_cuda_plan_equals_the_cpu_plan_on_a_seeded_tiny_model():
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 matmuls as on the CPU
    torch.backends.cudnn.allow_tf32 = False
    cpu_plan, cpu_pruned, _ = default_plan(tiny_llama(), IDS)
    gpu_plan, gpu_pruned, _ = default_plan(as_dtype(tiny_llama(), torch.float32, "cuda"), IDS)
    assert kept_units(gpu_plan) == kept_units(cpu_plan)
    torch.testing.assert_close(logits(gpu_pruned, IDS), logits(cpu_pruned, IDS), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_saved_cuda_model_reloads_to_the_same_logits(dtype, tmp_path):
    _, pruned, _ = default_plan(as_dtype(tiny_qwen2(), dtype, "cuda"), IDS)
    assert all(p.device.type == "cuda" and p.dtype == dtype for p in pruned.parameters())
    save_reload_same_logits(pruned, IDS, tmp_path / "m", dtype)


def test_streamed_equals_in_memory_on_cuda(tiny_model_folder, tmp_path, monkeypatch):
    from gapprune.cli import main

    folder, text = tiny_model_folder
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    common = ["--ratio", "0.3", "--calib", str(text), "--calib-samples", "4", "--profile-samples", "4",
              "--seq-len", "32", "--batch-size", "2", "--channel-step", "32", "--no-plots", "--device", "cuda"]
    assert main(["prune", str(folder), "--out", str(tmp_path / "mem"), "--offload", "off", *common]) == 0
    assert main(["prune", str(folder), "--out", str(tmp_path / "str"), "--offload", "on", *common]) == 0
    plans = [json.loads((tmp_path / name / "plan.json").read_text()) for name in ("mem", "str")]
    assert plans[0]["layers"] == plans[1]["layers"]
    from gapprune.api import load

    a, _ = load(str(tmp_path / "mem"), device="cuda")
    b, _ = load(str(tmp_path / "str"), device="cuda")
    torch.testing.assert_close(logits(b, IDS % 250), logits(a, IDS % 250), rtol=1e-3, atol=1e-4)


def test_torchrun_on_one_gpu_uses_nccl_and_gives_the_plain_plan(tiny_model_folder, tmp_path):
    folder, text = tiny_model_folder
    argv = ["prune", str(folder), "--ratio", "0.3", "--calib", str(text), "--calib-samples", "4", "--profile-samples",
            "4", "--seq-len", "32", "--batch-size", "2", "--channel-step", "32", "--no-plots", "--device", "cuda"]
    env = {**os.environ, "GAPPRUNE_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "NCCL_DEBUG": "INFO"}
    runs = {}
    for name, launch in (("plain", [sys.executable, "-m", "gapprune"]),
                         ("nccl", [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                   "1", "-m", "gapprune"])):
        done = subprocess.run([*launch, *argv, "--out", str(tmp_path / name)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = done
    group = json.loads((tmp_path / "nccl" / "run.json").read_text())["process_group"]
    assert "nccl" in group["backend"] and group["barrier"]  # a collective ran on NCCL, at world size 1 too
    assert "NCCL" in runs["nccl"].stdout + runs["nccl"].stderr
    plans = [json.loads((tmp_path / name / "plan.json").read_text())["layers"] for name in ("plain", "nccl")]
    assert plans[0] == plans[1]
