"""Memory that does not grow with depth: one layer's Gram matrices alive at a time, same numbers.

The Grams used to be accumulated for every layer during the calibration pass (28 × 8,960² × 4 B × 2
on Qwen2.5-1.5B, more than its weights). `LayerGrams` takes one layer's Grams while the calibration pass
runs it, and replays one dense layer from the cached inputs when asked later; these tests check it holds
one layer, that scoring replays none, and that it gives the same matrices, scores and pruned weights as
the eager hooks (an independent path).
"""

from __future__ import annotations

import copy
import json

import torch

from gapprune.calibrate import CalibrationStats, stats_observers
from gapprune.calibrate.gram import GramStats, LayerGrams, gram_observers
from gapprune.cli import main
from gapprune.engine.capture import capture_layer_inputs
from gapprune.importance import ScoringContext, score_units
from gapprune.models import get_adapter
from gapprune.pruning.compensate import prune_and_compensate_
from tests.conftest import tiny_qwen2
from tests.helpers import tiny_run
from tests.precision.contracts import IDS


def eager_grams(model: torch.nn.Module) -> GramStats:
    """Every layer's Grams from hooks on one calibration pass: the old path, as the reference."""
    adapter, grams, stats = get_adapter(model), GramStats(), CalibrationStats()

    def hooks() -> list:
        return stats_observers(adapter, stats)() + gram_observers(adapter, grams)()

    capture_layer_inputs(adapter, IDS, batch_size=2, observers=hooks, progress=False)
    return grams


class Watched(LayerGrams):
    """Records how many Gram matrices are alive after every `ensure`."""

    peak = 0

    def ensure(self, layer: int) -> None:
        super().ensure(layer)
        Watched.peak = max(Watched.peak, self.n_matrices())


def test_layer_grams_equal_the_eager_grams_bit_for_bit():
    model = tiny_qwen2()
    eager = eager_grams(model)
    assert eager.n_matrices() == 4 * 4  # 4 layers x 2 components x 2 halves: what used to stay alive
    run = tiny_run(model, IDS, criterion="obs", compensate="lsq")
    lazy = run.calibration.gram
    assert isinstance(lazy, LayerGrams)
    for layer in range(4):
        lazy.ensure(layer)
        assert lazy.n_matrices() == 4  # one layer: 2 components x 2 halves
        for key in lazy.fit:
            assert torch.equal(lazy.fit[key], eager.fit[key]) and torch.equal(lazy.held_out[key], eager.held_out[key])
            assert torch.equal(lazy.sums[key][1], eager.sums[key][1]) and lazy.counts[key] == eager.counts[key]
    swapped = lazy.swapped()
    swapped.ensure(2)
    assert torch.equal(swapped.fit[(2, "mlp")], eager.held_out[(2, "mlp")])
    assert lazy.n_matrices() == 4


def test_scoring_and_dense_fit_compensation_hold_one_layer_and_match_the_eager_path():
    model = tiny_qwen2()
    run = tiny_run(model, IDS, criterion="obs", compensate="lsq")
    eager = eager_grams(model)
    stats = run.calibration.stats
    assert run.calibration.gram.replays == 0  # scored while the capture pass ran each layer: none replayed
    eager_scores = score_units(ScoringContext(run.adapter, stats, {}, eager), "obs")
    assert eager_scores.to_dict() == run.calibration.scores.to_dict()

    plan = run.plan(0.3, "gap")
    watched = Watched(get_adapter(model), run.calibration.inputs)
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    watched.adapter = get_adapter(a)  # the Grams are replayed on the model being pruned, before each layer's surgery
    Watched.peak = 0
    summary = prune_and_compensate_(get_adapter(a), plan, "lsq", watched)
    prune_and_compensate_(get_adapter(b), plan, "lsq", eager)
    assert summary["applied"] + summary["kept_original"] > 0
    assert 0 < Watched.peak <= 4
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name


def test_a_streamed_prune_keeps_sequential_lsq(tiny_model_folder, tmp_path, monkeypatch):
    folder, text = tiny_model_folder
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    out = tmp_path / "streamed"
    argv = ["prune", str(folder), "--ratio", "0.3", "--out", str(out), "--calib", str(text), "--calib-samples", "4",
            "--profile-samples", "4", "--seq-len", "32", "--batch-size", "2", "--channel-step", "32", "--no-plots",
            "--offload", "on"]
    assert main(argv) == 0
    compensation = json.loads((out / "plan.json").read_text())["summary"]["compensation"]
    assert compensation["method"] == "lsq" and compensation["sequential"] is True


def test_offload_auto_counts_the_runs_working_set_not_only_the_weights(tiny_model_folder, monkeypatch):
    from gapprune.models.streaming import policy, should_stream, weights_bytes

    folder, _ = tiny_model_folder
    size, extra = weights_bytes(folder), policy.working_bytes(folder, tokens=4096)
    assert extra == 5 * 4096 * 64 * 4 + 2 * (64 * 64 + 128 * 128) * 4 + 3 * 128 * 128 * 8
    small = size + policy.working_bytes(folder, tokens=16)
    monkeypatch.setattr(policy, "available_bytes", lambda: 2 * small + 2)  # room for the weights and a short run
    assert not should_stream(folder, "auto", tokens=16)
    assert should_stream(folder, "auto", tokens=4096)  # the same weights, but 4,096 cached tokens do not fit


def test_the_pass_takes_grams_only_for_a_criterion_that_reads_them(monkeypatch):
    taken: list[int] = []
    accumulating = LayerGrams.accumulating

    def watched(self, layer, batches):  # type: ignore[no-untyped-def]
        taken.append(layer)
        return accumulating(self, layer, batches)

    monkeypatch.setattr(LayerGrams, "accumulating", watched)
    run = tiny_run(tiny_qwen2(), IDS, criterion="activation", compensate="lsq")
    assert taken == []  # compensation's Grams come later, replayed when read
    run.calibration.gram.ensure(1)
    assert taken == [1] and run.calibration.gram.replays == 1
    taken.clear()
    tiny_run(tiny_qwen2(), IDS, criterion="obs", compensate="lsq")
    assert taken == [0, 1, 2, 3]
