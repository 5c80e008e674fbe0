"""The layer-major exact profiler (one traversal of the decoder) gives the batched profiler's table."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gapprune.calibrate import CalibrationStats, stats_observers
from gapprune.engine.capture import capture_layer_inputs
from gapprune.importance import ScoringContext, score_units
from gapprune.models import get_adapter
from gapprune.profiling.batched import build_loss_table_batched
from gapprune.profiling.layer_major import build_loss_table_layer_major


def _parts(model: torch.nn.Module):
    ids = torch.randint(0, 256, (6, 24), generator=torch.Generator().manual_seed(1))
    adapter = get_adapter(model)
    stats = CalibrationStats()
    inputs = capture_layer_inputs(adapter, ids, batch_size=2, observers=stats_observers(adapter, stats), progress=False)
    return adapter, inputs, score_units(ScoringContext(adapter, stats, {}), "activation")


def _same(a, b) -> None:
    assert a.options == b.options
    for c in ("attn", "mlp"):
        assert np.array_equal(a.removed[c], b.removed[c])
        np.testing.assert_allclose(a.loss[c], b.loss[c], rtol=1e-4, atol=2e-6, err_msg=c)


@pytest.mark.parametrize("metric", ["kl", "nll"])
def test_layer_major_gives_the_batched_table(tiny_model, metric):
    adapter, inputs, scores = _parts(tiny_model)
    batched = build_loss_table_batched(adapter, inputs, scores, metric=metric, channel_step=32, mlp_stride=2,
                                       progress=False)
    # 96 rows: two 48-token option copies per pass, so replays of different start layers share passes
    layer_major = build_loss_table_layer_major(adapter, inputs, scores, metric=metric, channel_step=32, mlp_stride=2,
                                               max_rows=96, chunk_rows=7, progress=False)
    _same(layer_major, batched)
    assert layer_major.meta["traversal"] == "layer_major"


def test_pending_states_in_a_scratch_file_and_a_subset_of_layers(llama, tmp_path, monkeypatch):
    from gapprune.engine import layer_major

    scratch_files = []
    mkstemp = layer_major.tempfile.mkstemp
    monkeypatch.setattr(layer_major.tempfile, "mkstemp", lambda **kw: scratch_files.append(kw) or mkstemp(**kw))
    adapter, inputs, scores = _parts(llama)
    batched = build_loss_table_batched(adapter, inputs, scores, channel_step=32, layers=[1, 3], progress=False)
    rows: dict[int, dict] = {}
    on_file = build_loss_table_layer_major(adapter, inputs, scores, channel_step=32, layers=[1, 3], progress=False,
                                           max_pending_bytes=0, scratch_dir=tmp_path,
                                           on_layer=lambda layer, row: rows.__setitem__(layer, row))
    _same(on_file, batched)
    assert scratch_files and scratch_files[0]["dir"] == tmp_path  # the states went through a scratch file ...
    assert sorted(rows) == [1, 3] and not list(tmp_path.iterdir())  # ... which is gone
    marked = {c: {k: v + 1.0 for k, v in values.items()} for c, values in rows[1].items()}  # not what a replay gives
    resumed = build_loss_table_layer_major(adapter, inputs, scores, channel_step=32, layers=[1, 3], done={1: marked},
                                           progress=False)
    assert resumed.meta["resumed_layers"] == [1]
    for c, values in marked.items():  # layer 1 taken as given, not replayed
        for k, v in values.items():
            assert resumed.loss[c][1, int(k)] == pytest.approx(v)
    for c in ("attn", "mlp"):
        np.testing.assert_allclose(resumed.loss[c][3], batched.loss[c][3], rtol=1e-4, atol=2e-6)
