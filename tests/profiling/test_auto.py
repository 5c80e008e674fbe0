"""The auto profiler on synthetic tables: no model, the truth is a seeded table and `measure` reads it."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import numpy as np
import pytest

from gapprune.allocate.knapsack import solve_knapsack
from gapprune.allocate.table import LossTable
from gapprune.components import COMPONENTS
from gapprune.profiling.auto import Entries, Measured, auto_table, lagrange_multiplier

N_LAYERS = 8
UNIT = 4  # parameters per grain step of the synthetic costs
MARGIN = 0.5  # wider than the synthetic estimate's error, so the plan must come out exact


def synthetic_tables(seed: int = 0, error: float = 0.15) -> tuple[LossTable, LossTable]:
    """(truth, estimate): ΔL rising with the fraction removed, steeper in some layers; the estimate is
    the truth times a per-row bias and per-entry noise (log-normal, `error` wide)."""
    rng = np.random.default_rng(seed)
    options = {"attn": [[g] for g in (4, 3, 2, 1, 0)], "mlp": [[ch] for ch in range(16, -1, -2)]}
    loss, removed, guess = {}, {}, {}
    for c, full in (("attn", 40), ("mlp", 48)):
        n = len(options[c])
        frac = np.linspace(0.0, 1.0, n)  # (K,)
        removed[c] = np.tile(np.round(frac * full).astype(np.int64) * UNIT, (N_LAYERS, 1))  # (L, K)
        scale = rng.lognormal(0.0, 0.8, size=(N_LAYERS, 1))
        power = rng.uniform(1.3, 2.5, size=(N_LAYERS, 1))
        loss[c] = scale * frac**power * (1.0 + 0.05 * rng.standard_normal((N_LAYERS, n)))
        loss[c][:, 0] = 0.0
        bias = rng.lognormal(0.0, error, size=(N_LAYERS, 1))
        guess[c] = loss[c] * bias * rng.lognormal(0.0, error / 2, size=(N_LAYERS, n))
    truth = LossTable("kl", "activation", options, loss, removed, {"profiler": "exact"}, param_unit=UNIT)
    estimate = LossTable("kl", "activation", options, guess, removed, {"profiler": "fisher"},
                         exact={c: np.zeros(loss[c].shape, dtype=bool) for c in COMPONENTS}, param_unit=UNIT)
    return truth, estimate


def solver(budget: int):
    def solve(table: LossTable) -> dict[str, list[int]]:
        groups = [(c, layer) for layer in range(table.n_layers) for c in COMPONENTS]
        picks = solve_knapsack([table.removed[c][layer] // UNIT for c, layer in groups],
                               [table.loss[c][layer] for c, layer in groups], budget)
        plan: dict[str, list[int]] = {c: [0] * table.n_layers for c in COMPONENTS}
        for (c, layer), k in zip(groups, picks):
            plan[c][layer] = k
        return plan
    return solve


class Recorder:
    """A `measure` callback reading the truth, remembering every entry asked for."""

    def __init__(self, truth: LossTable) -> None:
        self.truth = truth
        self.asked: list[tuple[int, str, int]] = []

    def __call__(self, entries: Entries) -> Measured:
        out: Measured = {}
        for layer, per in entries.items():
            for c, ks in per.items():
                for k in ks:
                    self.asked.append((layer, c, k))
                    out.setdefault(layer, {}).setdefault(c, {})[k] = float(self.truth.loss[c][layer, k])
        return out


def budgets() -> list[int]:
    most = N_LAYERS * (40 + 48)
    return [math.ceil(r * most) for r in (0.2, 0.35, 0.5, 0.65)]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("budget", budgets())
def test_auto_plan_equals_the_exact_plan_and_measures_a_strict_subset(seed, budget):
    truth, estimate = synthetic_tables(seed)
    measure = Recorder(truth)
    table = auto_table(estimate, measure, solver(budget), margin=MARGIN, progress=False)
    assert solver(budget)(table) == solver(budget)(truth)
    asked = set(measure.asked)
    assert len(asked) == len(measure.asked), "an entry was measured twice"
    n_entries = sum(truth.loss[c][:, 1:].size for c in COMPONENTS)
    assert 0 < len(asked) < n_entries
    assert all(k > 0 for _, _, k in asked), "nothing removed is 0 by definition, never measured"
    for layer, c, k in asked:
        assert table.exact[c][layer, k] and table.loss[c][layer, k] == truth.loss[c][layer, k]
    plan = solver(budget)(table)
    for c in COMPONENTS:
        assert all(table.exact[c][layer, k] for layer, k in enumerate(plan[c])), "every pick is exact"


def test_the_progress_bar_counts_exact_entries_and_promises_no_end(capsys):
    truth, estimate = synthetic_tables(0)
    auto_table(estimate, Recorder(truth), solver(budgets()[1]), margin=MARGIN, progress=True)
    last = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert re.fullmatch(r"auto ΔL: round \d+: \d+/\d+ entries exact \[\d\d:\d\d\]", last), last


def test_exact_flags_and_estimates_survive_save_and_load(tmp_path):
    truth, estimate = synthetic_tables(3)
    table = auto_table(estimate, Recorder(truth), solver(budgets()[1]), progress=False)
    table.save(tmp_path / "loss_table.json")
    again = LossTable.load(tmp_path / "loss_table.json")
    for c in COMPONENTS:
        assert np.array_equal(again.exact[c], table.exact[c])
        assert np.array_equal(again.loss[c], table.loss[c])
    assert again.meta["auto"]["n_exact"] == table.meta["auto"]["n_exact"]
    assert again.meta["profiler"] == "auto"


def test_a_second_budget_measures_only_new_entries(tmp_path):
    truth, estimate = synthetic_tables(4)
    first = Recorder(truth)
    table = auto_table(estimate, first, solver(budgets()[0]), margin=MARGIN, progress=False)
    table.save(tmp_path / "loss_table.json")
    second = Recorder(truth)
    extended = auto_table(LossTable.load(tmp_path / "loss_table.json"), second, solver(budgets()[3]), margin=MARGIN,
                          progress=False)
    assert second.asked and not set(second.asked) & set(first.asked)
    assert solver(budgets()[3])(extended) == solver(budgets()[3])(truth)
    again = Recorder(truth)
    auto_table(extended, again, solver(budgets()[0]), margin=MARGIN, progress=False)
    assert again.asked == [], "a budget solved before needs nothing new"


def test_screening_narrows_what_is_measured_exactly():
    truth, estimate = synthetic_tables(5, error=0.6)
    budget = budgets()[2]
    rng = np.random.default_rng(9)
    noisy = truth.copy()
    for c in COMPONENTS:
        noisy.loss[c] = truth.loss[c] * rng.lognormal(0.0, 0.03, size=truth.loss[c].shape)
    plain, exact, screen = Recorder(truth), Recorder(truth), Recorder(noisy)
    auto_table(estimate, plain, solver(budget), margin=2.0, progress=False)
    table = auto_table(estimate, exact, solver(budget), screen=screen, margin=2.0, screen_margin=0.1, progress=False)
    assert solver(budget)(table) == solver(budget)(truth)
    assert screen.asked and len(exact.asked) < len(plain.asked)
    assert table.meta["auto"]["rounds"][0]["stage"] == "screen"


def test_lagrange_multiplier_reproduces_the_removed_parameters():
    truth, _ = synthetic_tables(6)
    plan = solver(budgets()[1])(truth)
    lam = lagrange_multiplier(truth, plan)

    def removed_at(price: float) -> int:
        relaxed = {c: np.argmin(truth.loss[c] - price * truth.removed[c], axis=1) for c in COMPONENTS}
        return sum(int(truth.removed[c][np.arange(N_LAYERS), relaxed[c]].sum()) for c in COMPONENTS)

    target = sum(int(truth.removed[c][np.arange(N_LAYERS), plan[c]].sum()) for c in COMPONENTS)
    assert lam > 0 and removed_at(lam) >= target
    assert removed_at(lam * (1 - 1e-6)) < target  # the smallest such price, not any large one


def test_a_coarser_grid_measures_only_its_columns():
    truth, estimate = synthetic_tables(7)
    budget = budgets()[1]
    measure = Recorder(truth)
    columns = {"attn": [1, 2, 3, 4], "mlp": [2, 4, 6, 8]}
    table = auto_table(estimate, measure, solver(budget), margin=MARGIN, columns=columns, progress=False)
    assert measure.asked and all(k in columns[c] for _, c, k in measure.asked)
    removed = table.removed["mlp"][0].astype(float)
    for layer in range(N_LAYERS):  # options between columns are interpolated in parameters removed
        assert table.loss["mlp"][layer, 3] == pytest.approx(np.interp(removed[3], removed[[2, 4]],
                                                                      table.loss["mlp"][layer, [2, 4]]))
    # an interpolated option is as exact as the exact profiler's own interpolation: when both its columns are
    for layer in range(N_LAYERS):
        for k in (1, 3, 5, 7):  # off the mlp grid (0 removes nothing and is exact by definition)
            assert table.exact["mlp"][layer, k] == (table.exact["mlp"][layer, k - 1] and table.exact["mlp"][layer, k + 1])
    picks = solver(budget)(table)
    assert table.chosen_exact(picks) == {"exact": 2 * N_LAYERS, "chosen": 2 * N_LAYERS}  # what the plan reads


def noisy_rungs(truth: LossTable, seed: int,
                climbed: dict[tuple[int, str, int], list[int]]) -> Callable[[Entries, int], Measured]:
    """A ladder's `measure`: the truth with a seeded error that shrinks as the windows grow; `climbed`
    collects the windows each entry was measured on, in order."""
    rng = np.random.default_rng(seed)
    noise = {c: rng.lognormal(0.0, 0.1, size=truth.loss[c].shape) for c in COMPONENTS}  # a rung's error

    def rung(entries: Entries, windows: int) -> Measured:
        out: Measured = {}
        for layer, per in entries.items():
            for c, ks in per.items():
                for k in ks:
                    climbed.setdefault((layer, c, k), []).append(windows)
                    out.setdefault(layer, {}).setdefault(c, {})[k] = float(truth.loss[c][layer, k] * noise[c][layer, k] ** (2 / windows))
        return out

    return rung


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("budget", budgets()[:3])
def test_a_ladder_climbs_rung_by_rung_and_ends_on_the_exact_plan(seed, budget):
    from gapprune.profiling.auto import Ladder

    truth, estimate = synthetic_tables(seed)
    climbed: dict[tuple[int, str, int], list[int]] = {}
    rung = noisy_rungs(truth, seed, climbed)

    measure = Recorder(truth)
    table = auto_table(estimate, measure, solver(budget), margin=MARGIN, progress=False,
                       ladder=Ladder(rung, (2, 4), (0.3, 0.2)))
    assert solver(budget)(table) == solver(budget)(truth)
    assert all(windows in ([2], [2, 4]) for windows in climbed.values())  # one rung a round, each once, in order
    assert set(measure.asked) <= {key for key, windows in climbed.items() if windows == [2, 4]}  # exact: from the top
    assert len(set(measure.asked)) < len(climbed)  # some candidates stopped on a rung
    stages = {r["stage"] for r in table.meta["auto"]["rounds"]}
    assert {"2 windows", "4 windows", "exact"} <= stages


@pytest.mark.parametrize("columns", [None, {"attn": [1, 2, 3, 4], "mlp": [2, 4, 6, 8]}])
def test_a_plan_solved_before_on_the_ladder_needs_nothing_new_and_comes_out_the_same(tmp_path, columns):
    """The rungs each entry reached are kept with the table, and an option between columns counts as exact
    only through its columns, as when the table was made: a saved profile used again for the same budget
    neither climbs again nor moves the plan (it did both before)."""
    from gapprune.profiling.auto import Ladder

    truth, estimate = synthetic_tables(2)
    climbed: dict[tuple[int, str, int], list[int]] = {}
    ladder, solve = Ladder(noisy_rungs(truth, 2, climbed), (2, 4), (0.3, 0.2)), solver(budgets()[1])
    table = auto_table(estimate, Recorder(truth), solve, margin=MARGIN, progress=False, ladder=ladder, columns=columns)
    assert any(r >= 0 for c in COMPONENTS for row in table.meta["auto"]["rung"][c] for r in row)
    table.save(tmp_path / "loss_table.json")
    first_climbs = sum(len(windows) for windows in climbed.values())
    again = Recorder(truth)
    reused = auto_table(LossTable.load(tmp_path / "loss_table.json"), again, solve, margin=MARGIN, progress=False,
                        ladder=ladder, columns=columns)
    assert again.asked == [] and sum(len(windows) for windows in climbed.values()) == first_climbs
    assert solve(reused) == solve(table)
    for c in COMPONENTS:
        np.testing.assert_array_equal(reused.loss[c], table.loss[c])
