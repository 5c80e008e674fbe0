"""The auto profiler's exact rounds replay only the windows after the screen's, for the values of whole replays."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gapprune.pipeline import plan_for
from gapprune.profiling import tables
from gapprune.profiling.screen_reuse import ScreenReuse
from tests.helpers import tiny_config, tiny_run


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 256, (8, 32), generator=torch.Generator().manual_seed(5))


@pytest.fixture(scope="module")
def exact_run(ids):
    from tests.conftest import tiny_llama

    return tiny_run(tiny_llama(), ids, channel_step=16)


def test_windows_cut_across_batches_in_order(exact_run):
    inputs = exact_run.calibration.profile_inputs  # 8 windows in batches of 2
    part = inputs.windows(1, 6)
    assert part.n_windows == 5 and [int(h.shape[0]) for h in part.final_hidden] == [1, 2, 2]
    for layer in (0, inputs.n_layers - 1):
        whole = torch.cat(inputs.hidden[layer])
        assert torch.equal(torch.cat(part.hidden[layer]), whole[1:6])
    assert torch.equal(torch.cat(part.input_ids), torch.cat(inputs.input_ids)[1:6])
    assert inputs.first(3).n_windows == 3 and torch.equal(torch.cat(inputs.first(3).final_hidden),
                                                          torch.cat(inputs.final_hidden)[:3])


@pytest.mark.parametrize("screen_stride", [1, 2])
def test_exact_rounds_replay_the_rest_and_agree_with_whole_replays(exact_run, ids, screen_stride, tmp_path, monkeypatch):
    calls: list[tuple[int, int]] = []  # (windows replayed, entries) per exact-round replay call
    real = tables.measure_entries

    def spy(adapter, inputs, entries, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append((inputs.n_windows, sum(len(ks) for per in entries.values() for ks in per.values())))
        return real(adapter, inputs, entries, *args, **kwargs)

    monkeypatch.setattr(tables, "measure_entries", spy)
    config = tiny_config(ids, channel_step=16, profiler="auto", ratio=0.3, auto_margin=1.0, screen_stride=screen_stride)
    auto = plan_for(config, exact_run.calibration, checkpoint_dir=tmp_path)[1].table
    windows = {w for w, n in calls if n}
    assert 7 in windows  # the screened entries: the seven windows after the screen's one
    assert (8 in windows) == (screen_stride > 1)  # a thinned screen leaves columns that replay every window
    assert auto.n_exact() > 0
    for c in ("attn", "mlp"):
        measured = auto.exact[c] & (auto.removed[c] > 0)
        np.testing.assert_allclose(auto.loss[c][measured], exact_run.table.loss[c][measured], rtol=1e-5, atol=1e-8)


def test_only_a_float32_screen_of_the_profiling_prefix_is_reused(exact_run, ids):
    calibration = exact_run.calibration
    adapter, inputs = calibration.adapter, calibration.profile_inputs
    screen = tables.screen_table(calibration, tiny_config(ids, channel_step=16, profiler="auto"))
    assert screen.meta["screen_windows"] == 1
    device = torch.device("cpu")
    reuse = ScreenReuse.prepare(screen, adapter, inputs, "kl", device)
    assert reuse is not None and reuse.rest.n_windows == 7
    screened, whole = reuse.split({0: {"attn": [0, 1], "mlp": [2]}})
    assert screened == {0: {"attn": [1], "mlp": [2]}} and whole == {0: {"attn": [0]}}  # option 0 is never replayed
    for change in ({"precision": "bfloat16"}, {"screen_windows": None}, {"screen_windows": 8}, {"tokens": 1}):
        other = screen.copy()
        other.meta = {**screen.meta, **change}
        assert ScreenReuse.prepare(other, adapter, inputs, "kl", device) is None, change
