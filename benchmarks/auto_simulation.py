"""Simulate the auto profiler on real SmolLM2-135M loss tables, with no model: the full exact table is the truth.

`gapprune.profiling.auto.auto_table` runs as in the pipeline, but `measure` (and `screen`) read the
truth (a table at fewer tokens) instead of replaying layers, and charge a cost calibrated on the
exact table's own per-layer wall times: one replayed copy from start layer l costs a·(L − l) + b
(decoder layers + LM head and metric), the dense base is one copy of the last layer, and a screen at T tokens costs the same copies scaled by the
measured wall-time ratio of the screening table to the full table.

    python benchmarks/auto_simulation.py --dir runs/auto_study --out runs/auto_study/simulation.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from gapprune.allocate.knapsack import common_grain, solve_knapsack
from gapprune.allocate.table import LossTable
from gapprune.components import COMPONENTS
from gapprune.profiling.auto import Entries, Measured, auto_table

TOTAL_PARAMS = 134_515_008  # SmolLM2-135M, embeddings included
RATIOS = (0.125, 0.25, 0.375, 0.5)


def load_table(path: Path, truth: bool) -> LossTable:
    """A saved table. As the truth, entries the exact profiler interpolated are flagged not exact;
    as an estimate (Fisher, or exact at fewer tokens), no entry is exact."""
    data = json.loads(path.read_text())
    table = LossTable.from_dict(data)
    assert table.exact is not None
    for c in COMPONENTS:
        table.exact[c][:] = False
        if truth:
            n = table.loss[c].shape[1]
            stride = int(data["meta"].get("mlp_stride", 1)) if c == "mlp" else 1
            table.exact[c][:, sorted(set(range(0, n, stride)) | {n - 1})] = True
    table.param_unit = 576
    return table


def solve(table: LossTable, budget_params: int) -> dict[str, list[int]]:
    """The gap allocator's DP (SmolLM2 has no biases, so every cost is on the grain)."""
    grain = common_grain([table.removed[c].ravel() for c in COMPONENTS])
    groups = [(c, layer) for layer in range(table.n_layers) for c in COMPONENTS]
    picks = solve_knapsack([table.removed[c][layer] // grain for c, layer in groups],
                           [table.loss[c][layer] for c, layer in groups], math.ceil(budget_params / grain))
    plan: dict[str, list[int]] = {c: [0] * table.n_layers for c in COMPONENTS}
    for (c, layer), k in zip(groups, picks):
        plan[c][layer] = k
    return plan


def plan_loss(truth: LossTable, plan: dict[str, list[int]]) -> float:
    return float(sum(truth.loss[c][layer, k] for c in COMPONENTS for layer, k in enumerate(plan[c])))


class CostModel:
    """Seconds of one replayed copy from start layer l: a·(L − l) + b.

    Default a, b: the clean two-core fit of docs/performance.md §1-2 (0.85 s per replayed layer and
    9.0 s per start layer for the 18 copies of a layer: 17 options and the dense base). With
    `fit=True` they are fitted on the truth table's own `meta["layer_wall_s"]` instead (only
    meaningful when that table was profiled on an otherwise idle machine).
    """

    def __init__(self, truth: LossTable, fit: bool = False) -> None:
        self.n_layers = truth.n_layers
        self.copies = 1 + sum(int(truth.exact[c][0, 1:].sum()) for c in COMPONENTS)  # dense base + options
        self.a, self.b = 0.85 / self.copies, 9.0 / self.copies
        if fit:
            walls = {int(k): float(v) for k, v in truth.meta["layer_wall_s"].items()}
            layers = np.array(sorted(walls))
            design = np.stack([self.n_layers - layers, np.ones(len(layers))], axis=1) * self.copies
            (self.a, self.b), *_ = np.linalg.lstsq(design, np.array([walls[int(x)] for x in layers]), rcond=None)
        self.full = float(sum((self.copies - 1) * self.unit(layer) for layer in range(self.n_layers))
                          + self.unit(self.n_layers - 1))  # every option, one dense base

    def unit(self, layer: int) -> float:
        return float(self.a * (self.n_layers - layer) + self.b)

    def call(self, entries: Entries, scale: float = 1.0, bases: set[int] | None = None) -> float:
        """One `measure_entries` call: its entries, plus the dense base. The base does not depend on
        the start layer, so it is one replay of the last layer; with `bases`, only the first call pays it."""
        seconds = sum(sum(len(ks) for ks in per.values()) * self.unit(layer) for layer, per in entries.items())
        if bases is None or not bases:
            seconds += self.unit(self.n_layers - 1)
        if bases is not None:
            bases.add(self.n_layers - 1)
        return scale * seconds


class Oracle:
    """`measure`/`screen` callbacks that read a table and add up the simulated seconds, both with a
    dense base replay per layer and call (`measure_entries` today) and with one base per layer."""

    def __init__(self, source: LossTable, cost: CostModel, scale: float) -> None:
        self.source, self.cost, self.scale = source, cost, scale
        self.bases: set[int] = set()
        self.seconds, self.seconds_cached, self.entries, self.calls = 0.0, 0.0, 0, 0

    def __call__(self, entries: Entries) -> Measured:
        self.seconds += self.cost.call(entries, self.scale)
        self.seconds_cached += self.cost.call(entries, self.scale, self.bases)
        self.entries += sum(len(ks) for per in entries.values() for ks in per.values())
        self.calls += 1
        return {layer: {c: {k: float(self.source.loss[c][layer, k]) for k in ks} for c, ks in per.items()}
                for layer, per in entries.items()}


def run_design(name: str, estimate: LossTable, estimate_s: float, truth: LossTable, cost: CostModel,
               screen_table: LossTable | None, screen_scale: float, params: dict[str, Any]) -> list[dict[str, Any]]:
    """One design at every ratio, each from the estimate alone, then chained: each ratio extends the
    previous ratio's table (12.5% -> 25% -> 37.5% -> 50%), costs summed."""
    rows: list[dict[str, Any]] = []
    table, spent = estimate, estimate_s
    for ratio in RATIOS:
        budget = math.ceil(ratio * TOTAL_PARAMS)
        best = solve(truth, budget)
        row: dict[str, Any] = {"design": name, **{k: v for k, v in params.items() if k != "columns"}, "ratio": ratio}
        for chained in (False, True):
            exact = Oracle(truth, cost, 1.0)
            screen = Oracle(screen_table, cost, screen_scale) if screen_table is not None else None
            result = auto_table(table if chained else estimate, exact, lambda t, b=budget: solve(t, b), screen=screen,
                                progress=False, **params)
            plan = solve(result, budget)
            gap = 100 * (plan_loss(truth, plan) - plan_loss(truth, best)) / plan_loss(truth, best)
            per_call = exact.seconds + (screen.seconds if screen else 0.0)
            cached = exact.seconds_cached + (screen.seconds_cached if screen else 0.0)
            if chained:
                spent += cached
                table = result
                row.update({"chained_gap_pct": gap, "chained_cum_cost_frac": spent / cost.full,
                            "chained_exact_total": result.n_exact() - count_free(result)})
            else:
                row.update({"exact_entries": exact.entries, "screened_entries": screen.entries if screen else 0,
                            "rounds": len(result.meta["auto"]["rounds"]),
                            "cost_frac": (per_call + estimate_s) / cost.full,
                            "cost_frac_cached_base": (cached + estimate_s) / cost.full,
                            "gap_pct": gap, "agreement": agreement(plan, best)})
        rows.append(row)
    return rows


def count_free(table: LossTable) -> int:
    return int(sum((table.removed[c] == 0).sum() for c in COMPONENTS))


def agreement(a: dict[str, list[int]], b: dict[str, list[int]]) -> float:
    same = sum(x == y for c in COMPONENTS for x, y in zip(a[c], b[c]))
    return same / sum(len(a[c]) for c in COMPONENTS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("runs/auto_study"))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--margins", type=lambda v: [float(x) for x in v.split(",")], default=[0.0, 0.25])
    parser.add_argument("--fit-cost", action="store_true", help="fit the cost model on the truth's layer wall times")
    parser.add_argument("--full-wall", type=float, default=649.0,
                        help="idle wall time of the full exact table (docs/performance.md §2), for screen costs")
    parser.add_argument("--screen-margins", default="1.0:0.1,2.0:0.25",
                        help="estimate:screen margin pairs for the fisher+screen designs")
    parser.add_argument("--estimate-margins", type=lambda v: [float(x) for x in v.split(",")], default=[0.25],
                        help="margins when a screening table is the whole estimate")
    args = parser.parse_args()
    tables = {p.parent.name: load_table(p, truth=False) for p in sorted(args.dir.glob("*/loss_table.json"))}
    truth = load_table(args.dir / "exact" / "loss_table.json", truth=True)
    cost = CostModel(truth, fit=args.fit_cost)
    print(f"cost model: {cost.a:.4f} s x layers replayed + {cost.b:.4f} s per copy; full table {cost.full:.0f} s "
          f"(this exact table's wall_s: {truth.meta['wall_s']})")
    walls = {name: float(t.meta.get("wall_s", 0.0)) for name, t in tables.items()}
    print("table wall_s:", walls)
    fisher = tables["fisher"]
    fisher_s = 19.6  # docs/performance.md §3, idle machine (this run's own time was taken under load)
    screens = {name: tables[name] for name in ("exact_s1", "exact_s2") if name in tables}
    # a screen on T tokens costs its table's measured wall time over the full table's (both idle)
    scale = {name: float(t.meta["wall_s"]) / args.full_wall for name, t in screens.items()}
    print("screen cost per copy relative to a full one:", {k: round(v, 3) for k, v in scale.items()})
    for name, t in tables.items():
        print(f"{name:12s} optimum ΔL gap of its own plan (vs truth):",
              [round(100 * (plan_loss(truth, solve(t, math.ceil(r * TOTAL_PARAMS)))
                            - plan_loss(truth, solve(truth, math.ceil(r * TOTAL_PARAMS))))
                     / plan_loss(truth, solve(truth, math.ceil(r * TOTAL_PARAMS))), 2) for r in RATIOS])
    grid = {"attn": list(range(1, truth.loss["attn"].shape[1])),  # the exact table's own columns
            "mlp": [int(k) for k in np.flatnonzero(truth.exact["mlp"][0]) if k]}
    rows: list[dict[str, Any]] = []
    for margin in args.margins:
        rows += run_design("fisher", fisher, fisher_s, truth, cost, None, 0.0, {"margin": margin, "columns": grid})
    for name, table in screens.items():
        for margin, screen_margin in (map(float, pair.split(":")) for pair in args.screen_margins.split(",")):
            rows += run_design(f"fisher+screen:{name}", fisher, fisher_s, truth, cost, table, scale[name],
                               {"margin": margin, "screen_margin": screen_margin, "columns": grid})
        for margin in args.estimate_margins:
            rows += run_design(f"estimate:{name}", table, scale[name] * cost.full, truth, cost, None, 0.0,
                               {"margin": margin, "columns": grid})
    for row in rows:
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
