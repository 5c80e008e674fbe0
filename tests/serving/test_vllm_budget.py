"""A speedup budget counted and verified in vLLM: the runtime's cost table from shapes served with random
weights, the same DP as llama.cpp's, and the pruned folder measured against the dense one in vLLM."""

from __future__ import annotations

import json

import pytest

from gapprune.budget import MemoryBudget, SpeedupBudget
from gapprune.budgets.microbench import BenchSettings
from gapprune.runtimes.vllm import Vllm, shape_config, with_anchor

SMALL = BenchSettings(file_type="f32", prompt_tokens=8, new_tokens=8, repeats=2, mlp_grid=2)


def test_a_shape_without_attention_keeps_one_head_in_layer_0() -> None:
    assert with_anchor([(0, 0, 64), (0, 0, 64)]) == [(1, 1, 64), (0, 0, 64)]
    assert with_anchor([(0, 0, 64), (2, 1, 0)]) == [(0, 0, 64), (2, 1, 0)]
    config = shape_config({"architectures": ["LlamaForCausalLM"], "hidden_size": 128}, [(2, 1, 0)])
    assert config["architectures"] == ["GapprunedLlamaForCausalLM"]
    assert config["layer_shapes"] == [{"num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 0}]


def test_vllm_counts_speedups_only() -> None:
    runtime = Vllm(SMALL)
    with pytest.raises(ValueError, match="the vllm runtime counts --speedup, not --max-memory"):
        runtime.check(MemoryBudget(1e6, 512), "model", verify=False, gguf=None)
    runtime.check(SpeedupBudget(1.2), "model", verify=True, gguf=None)  # verified on the folder: no --gguf


def test_a_speedup_budget_is_solved_on_vllm_costs_and_verified_in_vllm(vllm_env, servable_folder, tmp_path,
                                                                       monkeypatch) -> None:
    from gapprune.cli import main

    folder, text = servable_folder
    monkeypatch.setenv("GAPPRUNE_VLLM_PYTHON", vllm_env.python)
    monkeypatch.setenv("GAPPRUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(Vllm, "settings_for", classmethod(lambda cls, tensor_type, threads: SMALL))
    costs = Vllm(SMALL).costs(str(folder), None, timed=True)
    assert costs.key["runtime"] == "vllm" and costs.key["file_type"] == "f32"
    assert set(costs.fit["checks"]) == {"check/uniform-a", "check/uniform-b", "check/mixed", "dense"}
    for component in ("attn", "mlp"):
        decode = costs.cost["decode_us"][component]
        assert decode.shape == (4, len(costs.options[component])) and (decode >= 0).all()
    _, most = SpeedupBudget(1.0).reachable_range(costs)
    target = 1 + (most - 1) / 3  # reachable whatever the timings on these shared cores gave
    argv = ["prune", str(folder), "--calib", str(text), "--calib-samples", "4", "--profile-samples", "4",
            "--seq-len", "32", "--no-plots", "--speedup", f"{target:.4f}", "--runtime", "vllm", "--verify",
            "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    record = json.loads((tmp_path / "out" / "budget.json").read_text())
    assert record["runtime"] == "vllm" and record["budget"] == "speedup"
    assert record["predicted"] >= record["target"]  # the DP met it on the cost table it read (the cached one)
    assert record["measured"] > 0 and len(record["details"]["pairs"]) == 2
    assert record["met"] == (record["measured"] >= 0.95 * record["target"])
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == ["GapprunedLlamaForCausalLM"]
