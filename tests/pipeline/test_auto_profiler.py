"""`--profiler auto` on a real (tiny) model: the plan of the exact table, from a fraction of its replays."""

from __future__ import annotations

import numpy as np
import pytest

from gapprune.allocate import ALLOCATORS, LossTable
from gapprune.budget import RatioBudget
from gapprune.pipeline import plan_for
from gapprune.profiling.auto_measure import complete_table
from tests.helpers import tiny_config


@pytest.mark.parametrize("screen_stride", [1, 2])
@pytest.mark.parametrize("ratio", [0.1, 0.2, 0.3, 0.4])
def test_auto_plan_equals_the_exact_plan(auto_exact_run, auto_ids, ratio, screen_stride, tmp_path):
    # a margin wide enough for a one-window screen of this random model; SmolLM2 needs 0.1 (docs/performance.md)
    config = tiny_config(auto_ids, channel_step=16, profiler="auto", ratio=ratio, auto_margin=1.0, screen_stride=screen_stride)
    auto = plan_for(config, auto_exact_run.calibration, checkpoint_dir=tmp_path)[1].table
    budget = RatioBudget(ratio).params(auto_exact_run.profile.total_params)
    gap = ALLOCATORS.get("gap")
    assert gap(auto, None, budget).choice == gap(auto_exact_run.table, None, budget).choice
    picked = gap(auto, None, budget).choice
    for c in ("attn", "mlp"):
        for layer, k in enumerate(picked[c]):
            assert auto.exact[c][layer, k]  # every pick was measured exactly ...
            assert auto.loss[c][layer, k] == pytest.approx(auto_exact_run.table.loss[c][layer, k], rel=1e-6, abs=1e-9)
    assert auto.n_exact() < auto_exact_run.table.n_exact()  # ... from fewer replays than the full table


def test_a_table_completed_for_one_ratio_grows_for_another_and_survives_save(auto_exact_run, auto_ids, tmp_path):
    first = plan_for(tiny_config(auto_ids, channel_step=16, profiler="auto", ratio=0.2), auto_exact_run.calibration,
                     checkpoint_dir=tmp_path)[1].table
    first.save(tmp_path / "t.json")
    loaded = LossTable.load(tmp_path / "t.json")
    for c in ("attn", "mlp"):
        assert np.array_equal(loaded.exact[c], first.exact[c])
    config = tiny_config(auto_ids, channel_step=16, profiler="auto", ratio=0.4)
    budget = RatioBudget(0.4).params(auto_exact_run.profile.total_params)
    second = complete_table(auto_exact_run.calibration, loaded, config, lambda t: ALLOCATORS.get("gap")(t, None, budget).choice)
    for c in ("attn", "mlp"):
        assert (second.exact[c] >= first.exact[c]).all()  # nothing measured before is lost or re-estimated
        kept = first.exact[c]
        assert np.allclose(second.loss[c][kept], first.loss[c][kept])
    assert second.n_exact() > first.n_exact()  # the larger ratio's plan needed entries the first had not measured


def test_the_screen_thins_its_columns_by_default_only_for_a_billion_parameter_decoder(auto_exact_run, auto_ids, monkeypatch):
    from gapprune.profiling.auto_measure import screen_stride_of

    adapter = auto_exact_run.calibration.adapter
    assert screen_stride_of(adapter, tiny_config(auto_ids, profiler="auto")) == 1
    assert screen_stride_of(adapter, tiny_config(auto_ids, profiler="auto", screen_stride=3)) == 3
    monkeypatch.setattr(type(adapter), "decoder_params", lambda self: 1_300_000_000)
    assert screen_stride_of(adapter, tiny_config(auto_ids, profiler="auto")) == 2
