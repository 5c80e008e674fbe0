"""The auto profiler measures each entry window by window (the screen's, the ladder's rungs, all): every window
is replayed once, and the values are those of whole replays."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gapprune.pipeline import plan_for
from gapprune.profiling import auto_measure
from gapprune.profiling.prefix_replays import Known, PrefixReplays, screened_values
from tests.helpers import tiny_config


def test_windows_cut_across_batches_in_order(auto_exact_run):
    inputs = auto_exact_run.calibration.profile_inputs  # 8 windows in batches of 2
    part = inputs.windows(1, 6)
    assert part.n_windows == 5 and [int(h.shape[0]) for h in part.final_hidden] == [1, 2, 2]
    for layer in (0, inputs.n_layers - 1):
        whole = torch.cat(inputs.hidden[layer])
        assert torch.equal(torch.cat(part.hidden[layer]), whole[1:6])
    assert torch.equal(torch.cat(part.input_ids), torch.cat(inputs.input_ids)[1:6])
    assert inputs.first(3).n_windows == 3 and torch.equal(torch.cat(inputs.first(3).final_hidden),
                                                          torch.cat(inputs.final_hidden)[:3])


@pytest.mark.parametrize(("screen_stride", "precision"), [(1, "float32"), (2, "float32"), (1, "bfloat16")])
def test_every_window_is_replayed_once_and_the_values_are_whole_replays(auto_exact_run, auto_ids, screen_stride, precision,
                                                                          tmp_path, monkeypatch):
    replayed: dict[tuple[int, str, int], int] = {}  # windows replayed per entry, over all rounds
    real = auto_measure.measure_entries

    def spy(adapter, inputs, entries, *args, **kwargs):  # type: ignore[no-untyped-def]
        for layer, per in entries.items():
            for c, ks in per.items():
                for k in ks:
                    replayed[layer, c, k] = replayed.get((layer, c, k), 0) + inputs.n_windows
        return real(adapter, inputs, entries, *args, **kwargs)

    monkeypatch.setattr(auto_measure, "measure_entries", spy)
    config = tiny_config(auto_ids, channel_step=16, profiler="auto", ratio=0.3, auto_margin=1.0, screen_stride=screen_stride,
                         screen_precision=precision)
    auto = plan_for(config, auto_exact_run.calibration, checkpoint_dir=tmp_path)[1].table
    screened = {key for key in screened_values(auto_measure.screen_table(auto_exact_run.calibration, config),
                                               auto_exact_run.calibration.adapter, auto_exact_run.calibration.profile_inputs)}
    rungs = auto.meta["auto"]["ladder"]["windows"]
    assert rungs == [2, 4] and any(r["stage"] == "2 windows" for r in auto.meta["auto"]["rounds"])
    exact = {(int(layer), c, int(k)) for c in ("attn", "mlp")
             for layer, k in zip(*np.nonzero(auto.exact[c] & (auto.removed[c] > 0)), strict=True)}
    measured = exact & set(replayed)
    # a float32 screen's window counts for the exact value; a bf16 one's is replayed again in float32
    assert measured and all(replayed[key] == 8 - (key in screened and precision == "float32") for key in measured)
    assert any(key not in exact and replayed[key] < 8 for key in replayed)  # stopped on a rung: part of a replay
    assert (screen_stride > 1) == any(key not in screened for key in measured)
    for c in ("attn", "mlp"):
        on = auto.exact[c] & (auto.removed[c] > 0)
        np.testing.assert_allclose(auto.loss[c][on], auto_exact_run.table.loss[c][on], rtol=1e-5, atol=1e-8)


def test_a_screen_of_the_profiling_prefix_counts_and_a_bf16_one_as_rough(auto_exact_run, auto_ids):
    calibration = auto_exact_run.calibration
    adapter, inputs = calibration.adapter, calibration.profile_inputs
    screen = auto_measure.screen_table(calibration, tiny_config(auto_ids, channel_step=16, profiler="auto",
                                                          screen_precision="float32"))
    assert screen.meta["screen_windows"] == 1
    known = screened_values(screen, adapter, inputs)
    assert known[0, "attn", 1] == Known(1, pytest.approx(float(screen.loss["attn"][0, 1])))
    assert all(k for _, _, k in known)  # option 0 is never replayed
    rough = screen.copy()
    rough.meta = {**screen.meta, "precision": "bfloat16"}
    assert screened_values(rough, adapter, inputs)[0, "attn", 1] == Known(1, known[0, "attn", 1].value, 1,
                                                                          known[0, "attn", 1].value)
    for change in ({"screen_windows": None}, {"screen_windows": 8}, {"tokens": 1}):
        other = screen.copy()
        other.meta = {**screen.meta, **change}
        assert screened_values(other, adapter, inputs) == {}, change


def test_measure_replays_only_the_missing_windows_and_weighs_by_positions(auto_exact_run):
    calibration = auto_exact_run.calibration
    inputs = calibration.profile_inputs
    prefixes = PrefixReplays(calibration.adapter, inputs, "kl", torch.device("cpu"), {(0, "mlp", 1): Known(2, 0.5)})
    asked: list[tuple[int, int]] = []

    def replay(part, todo, reference, base):  # type: ignore[no-untyped-def]
        asked.append((part.n_windows, len(todo[0]["mlp"])))
        return {0: {"mlp": {k: 0.1 for k in todo[0]["mlp"]}}}

    out = prefixes.measure({0: {"mlp": [0, 1, 2]}}, 8, replay)
    assert sorted(asked) == [(6, 1), (8, 1)]  # option 1 lacks windows 2...7, option 2 all of them; option 0 none
    assert out[0]["mlp"] == {0: 0.0, 1: pytest.approx((2 * 0.5 + 6 * 0.1) / 8), 2: pytest.approx(0.1)}
    prefixes.learn(out, 8)
    assert prefixes.measure({0: {"mlp": [1]}}, 4, replay)[0]["mlp"][1] == out[0]["mlp"][1]  # measured on more: kept


def test_an_exact_value_replaces_the_rough_windows_share_with_their_float32_replay(auto_exact_run):
    calibration = auto_exact_run.calibration
    inputs = calibration.profile_inputs
    rough = Known(1, 0.4, rough=1, rough_value=0.4)  # a bf16 screen's window
    prefixes = PrefixReplays(calibration.adapter, inputs, "kl", torch.device("cpu"),
                             {(0, "mlp", 1): rough, (0, "mlp", 2): rough})
    asked: list[tuple[int, int, list[int]]] = []
    per_window = {1: [0.2, 0.1, 0.1, 0.3, 0.3, 0.3, 0.3, 0.3], 2: [0.3] * 8}  # float32 ΔL of each window

    real = prefixes.windows_of
    spans: list[tuple[int, int]] = []
    prefixes.windows_of = lambda start, stop: spans.append((start, stop)) or real(start, stop)  # type: ignore[method-assign]
    assert len({prefixes.positions_of(w + 1) - prefixes.positions_of(w) for w in range(8)}) == 1  # windows alike

    def replay(part, todo, reference, base):  # type: ignore[no-untyped-def]
        start, stop = spans[-1]
        asked.append((start, stop - start, todo[0]["mlp"]))
        return {0: {"mlp": {k: float(np.mean(per_window[k][start:stop])) for k in todo[0]["mlp"]}}}

    rung = prefixes.measure({0: {"mlp": [1]}}, 4, replay)  # a rung builds on the rough window
    assert asked == [(1, 3, [1])] and rung[0]["mlp"][1] == pytest.approx((0.4 + 0.1 + 0.1 + 0.3) / 4)
    prefixes.learn(rung, 4)
    asked.clear()
    out = prefixes.measure({0: {"mlp": [1, 2]}}, 8, replay)
    # option 1: window 0 again in float32 and windows 4...7; option 2 (only the screen known): all 8 at once
    assert sorted(asked) == [(0, 1, [1]), (0, 8, [2]), (4, 4, [1])]
    assert out[0]["mlp"] == {1: pytest.approx(np.mean(per_window[1])), 2: pytest.approx(0.3)}
    prefixes.learn(out, 8)
    assert prefixes.known[0, "mlp", 1] == Known(8, out[0]["mlp"][1])  # exact: nothing rough is left


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_a_saved_auto_profile_used_again_for_its_budget_replays_nothing_and_plans_the_same(auto_exact_run, auto_ids,
                                                                                            precision, tmp_path,
                                                                                            monkeypatch):
    """Its rung values are kept (`meta["auto"]`), so neither the margin test nor the prefix replays start over;
    a later budget's climb goes on from each entry's rung, on the same windows and rough shares as before."""
    from gapprune.profiling.profile import Profile

    config = tiny_config(auto_ids, channel_step=16, profiler="auto", ratio=0.3, auto_margin=1.0, screen_precision=precision)
    calibration = auto_exact_run.calibration
    plan, profile = plan_for(config, calibration, checkpoint_dir=tmp_path / "first")
    auto = profile.table.meta["auto"]
    assert any(r >= 0 for c in ("attn", "mlp") for row in auto["rung"][c] for r in row)
    profile.save(tmp_path / "profile")
    calls: list[int] = []
    real = auto_measure.measure_entries
    monkeypatch.setattr(auto_measure, "measure_entries", lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))
    again, _ = plan_for(config, calibration, Profile.load(tmp_path / "profile"), checkpoint_dir=tmp_path / "again")
    assert calls == [] and again.summary["choice"] == plan.summary["choice"]
    known = screened_values(Profile.load(tmp_path / "profile").table, calibration.adapter, calibration.profile_inputs)
    layer, c, k = next((layer, c, k) for c in ("attn", "mlp") for layer, row in enumerate(auto["rung"][c])
                       for k, r in enumerate(row) if r >= 0 and k and not profile.table.exact[c][layer, k])
    rung = auto["rung"][c][layer][k]
    assert known[layer, c, k].windows == auto["ladder"]["windows"][rung]
    assert known[layer, c, k].value == pytest.approx(auto["on_rung"][c][layer][k][rung])
    assert known[layer, c, k].rough == (1 if precision == "bfloat16" else 0)
