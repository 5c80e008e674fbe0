"""The core contracts, written once for any device and dtype: the bf16 CPU tests and the CUDA tests
(tests/gpu/) call the same functions, so what is checked on a GPU is what is checked here."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch
from torch import nn

from gapprune.allocate.table import LossTable
from gapprune.calibrate import CalibrationStats, stats_observers
from gapprune.engine.capture import capture_layer_inputs
from gapprune.engine.masks import masked_units
from gapprune.export.save import save
from gapprune.importance import ScoringContext, score_units
from gapprune.models import get_adapter
from gapprune.models.loading import load_model
from gapprune.pipeline import prune_model_
from gapprune.profiling.batched import build_loss_table_batched
from gapprune.profiling.loss_table import build_loss_table
from gapprune.pruning import Plan
from tests.helpers import tiny_run

IDS = torch.randint(0, 256, (8, 24), generator=torch.Generator().manual_seed(0))


def as_dtype(model: nn.Module, dtype: torch.dtype, device: str = "cpu") -> nn.Module:
    """Parameters in `dtype` on `device`, buffers (rotary inv_freq) left float32: what
    `from_pretrained(dtype=...)` gives, unlike `model.to(dtype)`."""
    model.to(device)
    for param in model.parameters():
        param.data = param.data.to(dtype)
    model.config.dtype = dtype
    return model


def logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    device = next(model.parameters()).device
    with torch.inference_mode():
        return model(input_ids=ids.to(device)).logits.float().cpu()


def removal_equals_masking(model: nn.Module, ids: torch.Tensor, atol: float) -> None:
    """Physically removing units gives the logits of zeroing their output-projection columns."""
    adapter = get_adapter(model)
    shape = adapter.layer_shape(1)
    heads, channels = [0, 1], list(range(0, shape.intermediate, 2))
    with masked_units(adapter, 1, "attn", heads), masked_units(adapter, 1, "mlp", channels):
        masked = logits(model, ids)
    assert not torch.allclose(masked, logits(model, ids), atol=atol), "masking must change the output"
    adapter.prune_attention_(1, heads)
    adapter.prune_mlp_(1, channels)
    torch.testing.assert_close(logits(model, ids), masked, rtol=0, atol=atol)


def default_plan(model: nn.Module, ids: torch.Tensor, ratio: float = 0.3) -> tuple[Plan, nn.Module, object]:
    """The default prune of a tiny model (obs, auto profiler, sequential lsq): plan, pruned copy, run."""
    run = tiny_run(model, ids, criterion="obs", compensate="lsq", profiler="auto")
    plan = run.plan(ratio, "gap")
    pruned = copy.deepcopy(model)
    prune_model_(pruned, plan, "lsq", run.calibration.gram, 1.0, run.calibration.inputs)
    return plan, pruned, run


def kept_units(plan: Plan) -> list[tuple[list[int], int]]:
    return [(lp.attn.kept, len(lp.mlp.kept)) for lp in plan.layers]


def batched_equals_reference(model: nn.Module, ids: torch.Tensor, rtol: float, atol: float) -> None:
    """The batched exact profiler reproduces the one-option-at-a-time reference table."""
    adapter = get_adapter(model)
    stats = CalibrationStats()
    inputs = capture_layer_inputs(adapter, ids, batch_size=2, observers=stats_observers(adapter, stats), progress=False)
    scores = score_units(ScoringContext(adapter, stats, {}), "activation")
    reference = build_loss_table(adapter, inputs, scores, metric="kl", channel_step=32, mlp_stride=2, progress=False)
    batched = build_loss_table_batched(adapter, inputs, scores, metric="kl", channel_step=32, mlp_stride=2,
                                       max_rows=4096, chunk_rows=7, progress=False)
    assert batched.options == reference.options
    for c in ("attn", "mlp"):
        assert np.allclose(batched.loss[c], reference.loss[c], rtol=rtol, atol=atol), c


def save_reload_same_logits(model: nn.Module, ids: torch.Tensor, folder: Path, dtype: torch.dtype) -> None:
    """A saved model reloads (in its dtype, on its device) to the same logits; config.json records the dtype."""
    import json

    device = str(next(model.parameters()).device)
    save(model, None, folder)
    assert json.loads((folder / "config.json").read_text())["dtype"] == str(dtype).removeprefix("torch.")
    reloaded, _ = load_model(str(folder), dtype=dtype, device=device)
    assert all(p.dtype == dtype for p in reloaded.parameters())
    assert torch.equal(logits(reloaded, ids), logits(model, ids))


def replayed_table(model: nn.Module, ids: torch.Tensor, precision: str) -> LossTable:
    """The batched table of `model` on `ids` (activation scores, channel step 32), replayed in `precision`."""
    adapter = get_adapter(model)
    stats = CalibrationStats()
    device = next(model.parameters()).device
    inputs = capture_layer_inputs(adapter, ids.to(device), batch_size=4, observers=stats_observers(adapter, stats),
                                  progress=False)
    scores = score_units(ScoringContext(adapter, stats, {}), "activation")
    return build_loss_table_batched(adapter, inputs, scores, metric="kl", channel_step=32, mlp_stride=2,
                                    progress=False, precision=precision)


def bf16_replays_run_on_half_weights(model: nn.Module, ids: torch.Tensor) -> None:
    """A table replayed under bf16 autocast (the screen's `auto` precision on a GPU) for a model whose
    weights are float16 or bf16: float16 + bf16 residual sums come out float32, and the head must
    still take them (it did not: `expected m1 and m2 to have the same dtype`)."""
    table = replayed_table(model, ids, "bfloat16")
    for c, loss in table.loss.items():
        assert np.isfinite(loss).all() and (loss[:, -1] > 0).all(), c


def bf16_screen_near_float32(model: nn.Module, ids: torch.Tensor) -> None:
    """A float32 model's table replayed in bf16 (the screen), its head's product of the difference from the
    dense state in bf16 too (`engine.head.RoughHead`): the float32 table's values up to the bf16 layers'
    rounding, and the same order of options in every row."""
    tables = {precision: replayed_table(model, ids, precision) for precision in ("float32", "bfloat16")}
    for c, exact in tables["float32"].loss.items():
        rough = tables["bfloat16"].loss[c]
        measured = exact > 1e-4
        assert np.median(np.abs(rough[measured] / exact[measured] - 1)) < 0.02, c  # 0.1-0.3% measured
        assert (np.argsort(rough[:, 1:], axis=1) == np.argsort(exact[:, 1:], axis=1)).mean() > 0.9, c
