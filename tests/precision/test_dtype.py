"""bfloat16 and float16 end to end on CPU: the weights keep their dtype through surgery, compensation,
saving and GGUF export, while statistics, Grams and solves accumulate in float32 (or float64)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gapprune.budget import RatioBudget
from gapprune.cli import build_parser
from gapprune.config import PruneConfig
from gapprune.models.loading import resolve_dtype
from tests.conftest import tiny_llama, tiny_qwen2
from tests.helpers import tiny_run
from tests.precision.contracts import (
    IDS,
    as_dtype,
    bf16_replays_run_on_half_weights,
    bf16_screen_near_float32,
    default_plan,
    removal_equals_masking,
    save_reload_same_logits,
)

BF16 = torch.bfloat16
HALF = [pytest.param(BF16, id="bf16"), pytest.param(torch.float16, id="fp16")]


def test_auto_dtype_is_float32_on_cpu_and_the_checkpoints_own_on_a_gpu():
    class Config:
        dtype = "bfloat16"

    assert resolve_dtype("auto", "cpu", Config()) == torch.float32
    assert resolve_dtype(None, "cuda:1", Config()) == BF16
    assert resolve_dtype("auto", "cuda", object()) == torch.float32  # no dtype recorded
    assert resolve_dtype("float16", "cpu") == torch.float16
    with pytest.raises(ValueError, match="dtype must be"):
        resolve_dtype("int8", "cpu")
    with pytest.raises(ValueError, match="dtype must be"):
        PruneConfig(ratio=0.3, dtype="half")


@pytest.mark.parametrize("command", ["prune", "profile", "ppl", "eval", "bench", "info", "export", "tune"])
def test_every_command_that_loads_a_model_takes_dtype(command):
    required = {"prune": ["--ratio", "0.3", "--out", "o"], "profile": ["--out", "o"], "export": ["--gguf", "o.gguf"],
                "tune": ["--out", "o"]}.get(command, [])
    args = build_parser().parse_args([command, "m", *required, "--dtype", "bfloat16"])
    assert args.dtype == "bfloat16"


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2])
def test_removal_equals_masking_in_half_precision(make, dtype):
    removal_equals_masking(as_dtype(make(), dtype), IDS, atol=1e-2)


@pytest.mark.parametrize("dtype", HALF)
def test_half_precision_default_prune_keeps_its_weights_dtype_and_float32_statistics(tmp_path, dtype):
    model = as_dtype(tiny_qwen2(), dtype)
    plan, pruned, run = default_plan(model, IDS)
    assert plan.params_removed > 0
    assert all(p.dtype == dtype for p in pruned.parameters())  # compensation's biases included
    gram = run.calibration.gram
    gram.ensure(0)
    assert all(g.dtype == torch.float32 for g in (*gram.fit.values(), *gram.held_out.values()))
    assert all(s.sum.dtype == torch.float64 for per in run.calibration.stats.stats for s in per.values())
    assert run.calibration.inputs.hidden[0][0].dtype == dtype  # cached layer inputs: the activations' own dtype
    assert all(torch.isfinite(torch.as_tensor(run.table.loss[c])).all() for c in ("attn", "mlp"))
    save_reload_same_logits(pruned, IDS, tmp_path / "half", dtype)


def summed(table, choice: dict[str, list[int]]) -> float:  # type: ignore[no-untyped-def]
    return float(sum(table.loss[c][layer, k] for c, ks in choice.items() for layer, k in enumerate(ks)))


def table_error(a, b, choice: dict[str, list[int]]) -> float:  # type: ignore[no-untyped-def]
    return float(sum(abs(a.loss[c][layer, k] - b.loss[c][layer, k]) for c, ks in choice.items() for layer, k in enumerate(ks)))


def test_bf16_plan_is_as_good_on_the_float32_table_as_the_bf16_tables_error_allows():
    """Both plans solve the same budget exactly, each on its own exact table. Scored on the float32 table,
    the bf16 plan can be worse than the float32 optimum by at most the two tables' disagreement on the
    entries the two plans choose (T32(p16) ≤ T16(p16) + E(p16) ≤ T16(p32) + E(p16) ≤ T32(p32) + E(p32) + E(p16)),
    and not better at all. A bf16 table that measured something else, or a plan not solved on it, fails."""
    run32 = tiny_run(tiny_llama(), IDS, criterion="obs", compensate="lsq", profiler="exact")
    run16 = tiny_run(as_dtype(tiny_llama(), BF16), IDS, criterion="obs", compensate="lsq", profiler="exact")
    plan32, plan16 = run32.plan(0.3, "gap"), run16.plan(0.3, "gap")
    c32, c16 = plan32.summary["choice"], plan16.summary["choice"]
    for component in c32:  # the same parameter costs, so the same budget in parameters
        assert np.array_equal(run16.table.removed[component], run32.table.removed[component])
    budget = RatioBudget(0.3).params(run32.profile.total_params)
    assert plan16.params_removed >= budget and plan32.params_removed >= budget
    optimum, bf16_on_32 = summed(run32.table, c32), summed(run32.table, c16)
    slack = table_error(run16.table, run32.table, c32) + table_error(run16.table, run32.table, c16)
    assert optimum - 1e-9 <= bf16_on_32 <= optimum + slack + 1e-9
    assert slack < 0.25 * optimum  # and the bf16 table measures the same thing, to bf16's precision


@pytest.mark.parametrize(("dtype", "stored"), [("bfloat16", "BF16"), ("float16", "F16")])
def test_cli_prune_in_half_precision_saves_that_dtype_and_records_it(tiny_model_folder, tmp_path, dtype, stored):
    from gapprune.cli import main

    folder, text = tiny_model_folder
    out = tmp_path / "out"
    argv = ["prune", str(folder), "--ratio", "0.3", "--out", str(out), "--calib", str(text), "--calib-samples", "4",
            "--profile-samples", "4", "--seq-len", "32", "--batch-size", "2", "--channel-step", "32", "--no-plots",
            "--dtype", dtype, "--gguf", str(tmp_path / "m.gguf"), "--gguf-type", "f16"]
    assert main(argv) == 0
    assert json.loads((out / "config.json").read_text())["dtype"] == dtype
    assert json.loads((out / "plan.json").read_text())["config"]["dtype"] == dtype
    from safetensors import safe_open

    with safe_open(out / "model.safetensors", "pt") as f:
        stored_dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    assert stored_dtypes == {stored}
    assert (tmp_path / "m.gguf").stat().st_size > 0


def test_gguf_export_from_bf16_equals_export_from_its_float32_upcast(tmp_path):
    pytest.importorskip("gguf")
    from gapprune.export.gguf import export_gguf
    from tests.export.test_gguf import byte_level_tokenizer, heterogeneous, tiny

    tokenizer = byte_level_tokenizer()
    model = heterogeneous(tiny("llama", len(tokenizer))).to(BF16)
    a = export_gguf(model, tokenizer, tmp_path / "bf16.gguf", file_type="f32")
    b = export_gguf(model.float(), tokenizer, tmp_path / "f32.gguf", file_type="f32")
    assert (tmp_path / "bf16.gguf").read_bytes() == (tmp_path / "f32.gguf").read_bytes()
    assert a.params == b.params


def test_a_dequantized_gguf_loads_in_bf16_from_a_bf16_copy_made_once(tmp_path):
    from gapprune.models.loading import load_model

    dense = tiny_llama()
    folder = tmp_path / "gguf" / "tiny-0123"  # where GGUF dequantization caches its float32 folder
    dense.save_pretrained(folder)
    model, _ = load_model(str(folder), dtype="bfloat16", cache_dir=tmp_path)
    copy = tmp_path / "gguf" / "tiny-0123-bfloat16"
    assert json.loads((copy / "config.json").read_text())["dtype"] == "bfloat16"
    for (name, a), (_, b) in zip(model.state_dict().items(), dense.state_dict().items(), strict=True):
        assert a.dtype == BF16 and torch.equal(a, b.to(BF16)), name
    mtime = (copy / "model.safetensors").stat().st_mtime_ns
    load_model(str(folder), dtype="bfloat16", cache_dir=tmp_path)
    assert (copy / "model.safetensors").stat().st_mtime_ns == mtime  # made once
    assert sorted(p.name for p in (tmp_path / "gguf").iterdir()) == ["tiny-0123", "tiny-0123-bfloat16"]


def test_a_bf16_cache_of_layer_inputs_measures_what_a_float32_copy_of_it_measures():
    """The cache keeps bf16 activations in bf16 (half the bytes); every replay casts to the weights'
    dtype, so the table is the same, bit for bit, as from the same numbers held in float32."""
    from gapprune.calibrate import CalibrationStats, stats_observers
    from gapprune.engine.capture import LayerInputs, capture_layer_inputs
    from gapprune.importance import ScoringContext, score_units
    from gapprune.models import get_adapter
    from gapprune.profiling.batched import build_loss_table_batched

    adapter = get_adapter(as_dtype(tiny_qwen2(), BF16))
    stats = CalibrationStats()
    inputs = capture_layer_inputs(adapter, IDS, batch_size=2, observers=stats_observers(adapter, stats), progress=False)
    assert inputs.hidden[1][0].dtype == BF16 and inputs.final_hidden[0].dtype == BF16
    upcast = LayerInputs(hidden=[[h.float() for h in per] for per in inputs.hidden], kwargs=inputs.kwargs,
                         final_hidden=[h.float() for h in inputs.final_hidden], input_ids=inputs.input_ids)
    scores = score_units(ScoringContext(adapter, stats, {}), "activation")
    tables = [build_loss_table_batched(adapter, cache, scores, metric="kl", channel_step=32, mlp_stride=2, progress=False)
              for cache in (inputs, upcast)]
    for c in ("attn", "mlp"):
        assert np.array_equal(tables[0].loss[c], tables[1].loss[c]), c


@pytest.mark.parametrize("dtype", HALF)
def test_a_bf16_screen_runs_on_half_precision_weights(dtype):
    bf16_replays_run_on_half_weights(as_dtype(tiny_llama(), dtype), IDS)


def test_a_bf16_screen_of_float32_weights_stays_near_the_float32_table():
    bf16_screen_near_float32(tiny_llama(), IDS)
