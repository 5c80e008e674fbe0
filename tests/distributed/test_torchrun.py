"""Profiling shared across torchrun ranks (gloo, CPU): same table and same pruned folder for 1, 2 and 3
processes; a failing rank fails the run, names itself and leaves no output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from gapprune.distributed import rank_device, refuse_shared_gpus, setup, shard_layers

HERE = Path(__file__).resolve().parent


def prune_argv(folder: Path, text: Path, out: Path) -> list[str]:
    return ["prune", str(folder), "--ratio", "0.3", "--out", str(out), "--calib", str(text), "--calib-samples", "4",
            "--profile-samples", "4", "--seq-len", "32", "--batch-size", "2", "--channel-step", "32", "--no-plots"]


def run(launch: list[str], argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GAPPRUNE_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([*launch, *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
                          check=False)


def torchrun(n: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n)]


def test_a_numbered_gpu_for_several_ranks_is_refused_before_joining(monkeypatch):
    """`--device cuda:0` under torchrun would put every rank on GPU 0; a bare `cuda` spreads them."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # the same on a machine with any GPUs or none
    with pytest.raises(ValueError, match="pass --device cuda"):
        setup("cuda:0")


def test_each_rank_gets_its_own_gpu_or_a_clear_error():
    assert [rank_device("cuda", r, 4, 4) for r in range(4)] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert rank_device("cuda", 2, 4, 1) == "cuda:0"  # the launcher gave each rank one GPU (SLURM)
    assert rank_device("cuda:3", 0, 1, 8) == "cuda:3"  # one rank per machine: any GPU of it
    assert rank_device("cpu", 1, 2, 0) == "cpu"
    with pytest.raises(ValueError, match="pass --device cuda"):
        rank_device("cuda:0", 1, 2, 2)
    for local_rank in (0, 2):  # every rank refuses, not only those without a GPU
        with pytest.raises(ValueError, match="start at most 2 ranks per machine"):
            rank_device("cuda", local_rank, 3, 2)


def test_ranks_sharing_a_gpu_are_refused_by_name():
    refuse_shared_gpus(["a:GPU-1", "a:GPU-2", "b:GPU-1"])  # the same UUID on two hosts is two GPUs
    with pytest.raises(ValueError, match="ranks 0/2 share one GPU"):
        refuse_shared_gpus(["a:GPU-1", "a:GPU-2", "a:GPU-1"])


def test_start_layers_are_split_by_replay_cost():
    for n_layers in (1, 4, 7, 32):
        for size in (1, 2, 3):
            parts = [shard_layers(n_layers, size, r) for r in range(size)]
            assert sorted(layer for part in parts for layer in part) == list(range(n_layers))
            cost = [sum(n_layers - l + 1 for l in part) for part in parts]
            assert max(cost) - min(cost) <= n_layers + 1  # within one layer's cost


def test_world_sizes_1_2_3_give_the_same_table_and_folder(tiny_model_folder, tmp_path):
    folder, text = tiny_model_folder
    outs = {}
    for name, launch in (("plain", [sys.executable, "-m", "gapprune"]), ("ws1", torchrun(1)), ("ws2", torchrun(2)),
                         ("ws3", torchrun(3))):
        out = tmp_path / name
        if name != "plain":
            launch = [*launch, "-m", "gapprune"]
        done = run(launch, prune_argv(folder, text, out), tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        outs[name] = out
    tables = {name: json.loads((out / "loss_table.json").read_text()) for name, out in outs.items()}
    assert tables["ws3"]["meta"]["world_size"] == 3 and len(tables["ws3"]["meta"]["rank_layers"]) == 3
    auto = tables["ws3"]["meta"]["auto"]  # the exact rounds are split over the ranks too, not repeated by each
    assert [sum(r) for r in auto["rank_entries"]] == [r["entries"] for r in auto["rounds"]]
    assert any(sum(n > 0 for n in r) > 1 for r in auto["rank_entries"])
    groups = {name: json.loads((out / "run.json").read_text()).get("process_group") for name, out in outs.items()}
    assert groups["plain"] is None  # no torchrun, no group
    assert groups["ws1"] == {"backend": "gloo", "world_size": 1, "barrier": True}  # world size 1 still joins one
    for name in ("ws1", "ws2", "ws3"):
        for c in ("attn", "mlp"):
            np.testing.assert_allclose(tables[name]["loss"][c], tables["plain"]["loss"][c], rtol=1e-5, atol=1e-7)
        plan, reference = (json.loads((outs[n] / "plan.json").read_text())["layers"] for n in (name, "plain"))
        assert plan == reference
        weights, dense = load_file(outs[name] / "model.safetensors"), load_file(outs["plain"] / "model.safetensors")
        assert weights.keys() == dense.keys()
        for key in weights:
            np.testing.assert_allclose(weights[key].numpy(), dense[key].numpy(), rtol=1e-5, atol=1e-6)
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert not leftovers


def test_a_failing_rank_fails_the_run_and_leaves_no_output(tiny_model_folder, tmp_path):
    folder, text = tiny_model_folder
    out = tmp_path / "out"
    done = run([*torchrun(2), str(HERE / "failing_rank.py")], prune_argv(folder, text, out), tmp_path)
    assert done.returncode != 0
    assert "rank 1 of 2 failed: RuntimeError: injected profiling failure" in done.stderr
    assert not out.exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")]


@pytest.mark.parametrize("argv", [["--help"]])
def test_python_dash_m_gapprune_runs_the_cli(argv, tmp_path):
    done = run([sys.executable, "-m", "gapprune"], argv, tmp_path)
    assert done.returncode == 0 and "prune" in done.stdout


def test_streamed_layers_on_two_ranks_give_the_in_memory_table_and_plan(tiny_model_folder, tmp_path):
    folder, text = tiny_model_folder
    plain, shared = tmp_path / "plain", tmp_path / "shared"
    exact = ["--profiler", "exact"]  # a streamed model's auto profile is the exact one, measured layer-major
    assert run([sys.executable, "-m", "gapprune"], [*prune_argv(folder, text, plain), "--offload", "off", *exact],
               tmp_path).returncode == 0
    done = run([*torchrun(2), "-m", "gapprune"], [*prune_argv(folder, text, shared), "--offload", "on"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    table, reference = (json.loads((out / "loss_table.json").read_text()) for out in (shared, plain))
    assert table["meta"]["traversal"] == "layer_major" and table["meta"]["world_size"] == 2
    for c in ("attn", "mlp"):
        np.testing.assert_allclose(table["loss"][c], reference["loss"][c], rtol=1e-5, atol=1e-7)
    assert (json.loads((shared / "plan.json").read_text())["layers"]
            == json.loads((plain / "plan.json").read_text())["layers"])
    assert (shared / "model.safetensors.index.json").is_file()
