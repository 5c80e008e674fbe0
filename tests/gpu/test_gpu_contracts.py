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
    bf16_replays_run_on_half_weights,
    bf16_screen_near_float32,
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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_bf16_screen_runs_on_half_precision_weights_on_cuda(dtype):
    bf16_replays_run_on_half_weights(as_dtype(tiny_llama(), dtype, "cuda"), IDS)


def test_a_bf16_screen_of_float32_weights_stays_near_the_float32_table_on_cuda():
    bf16_screen_near_float32(as_dtype(tiny_llama(), torch.float32, "cuda"), IDS)


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
                              capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = done
    group = json.loads((tmp_path / "nccl" / "run.json").read_text())["process_group"]
    assert "nccl" in group["backend"] and group["cuda_all_reduce"]  # a collective ran on NCCL, at world size 1 too
    assert "NCCL" in runs["nccl"].stdout + runs["nccl"].stderr
    plans = [json.loads((tmp_path / name / "plan.json").read_text())["layers"] for name in ("plain", "nccl")]
    assert plans[0] == plans[1]


def test_grams_obs_and_lsq_stay_on_the_gpu_and_agree_with_the_cpu():
    """The solves run where the Grams are: on CUDA here, with the CPU's order and a refit within float32 noise."""
    from gapprune.calibrate.gram import GramStats
    from gapprune.importance.obs import obs_order, obs_order_tokens
    from gapprune.refit import refit

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(512, 64, generator=gen)
    weight = torch.randn(32, 64, generator=gen)
    gram = x.T @ x
    on_gpu = GramStats(fit={(0, "mlp"): gram.cuda()},
                       held_out={(0, "mlp"): (gram * 1.1).cuda()},
                       sums={(0, "mlp"): [x.double().sum(0).cuda(), x.double().sum(0).cuda()]},
                       counts={(0, "mlp"): [512, 512]})
    on_gpu.settle_()
    assert on_gpu.fit[(0, "mlp")].is_cuda  # an H200 holds a 64 x 64 Gram many times over
    assert obs_order(weight.cuda(), [gram.cuda()], 1, 4) == obs_order(weight, [gram], 1, 4)
    assert obs_order_tokens(weight.cuda(), x.cuda(), 1, 4) == obs_order_tokens(weight, x, 1, 4)
    on_cpu = GramStats(fit={k: v.cpu() for k, v in on_gpu.fit.items()},
                       held_out={k: v.cpu() for k, v in on_gpu.held_out.items()},
                       sums={k: [t.cpu() for t in v] for k, v in on_gpu.sums.items()}, counts=dict(on_gpu.counts))
    cols = list(range(0, 64, 2))
    gpu_fit, cpu_fit = (refit(weight, cols, stats, (0, "mlp"), "lsq") for stats in (on_gpu, on_cpu))
    assert gpu_fit.weight.is_cuda
    torch.testing.assert_close(gpu_fit.weight.cpu(), cpu_fit.weight, rtol=1e-3, atol=1e-4)
    assert gpu_fit.after == pytest.approx(cpu_fit.after, rel=1e-3)


def test_channel_statistics_reduce_on_the_gpu_to_the_cpu_values():
    from gapprune.calibrate.stats import ChannelStats

    x = torch.randn(4, 128, 96, generator=torch.Generator().manual_seed(1))
    gpu, cpu = ChannelStats.zeros(96), ChannelStats.zeros(96)
    gpu.update(x.cuda())
    cpu.update(x)
    torch.testing.assert_close(gpu.mean, cpu.mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gpu.var, cpu.var, rtol=1e-4, atol=1e-6)
