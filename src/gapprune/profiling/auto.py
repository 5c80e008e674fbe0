"""The auto profiler: exact ΔL only where it can change the allocation (issue 14).

The exact table replays every option of every component (510 replays for SmolLM2-135M, quadratic
in depth), yet the DP picks one option per component and most options are far from any pick.
`auto_table` starts from a cheap estimate (the Fisher table), solves the allocation, and measures
exactly only the entries that could change it:

1. Working table. Exact entries as measured; screened entries (the exact metric on a short token
   prefix) and the remaining estimates each rescaled per row by the measured exact/screened or
   exact/estimate ratio, interpolated in log space between that row's measured options (a row with
   none uses the median ratio of its component), so one exact entry corrects its whole neighbourhood.
2. Plan. `solve(working)`, and the Lagrange multiplier λ at which the relaxed problem (each row
   alone minimises ΔL − λ·removed) removes as much as the plan does.
3. Margin test. Option k of a row is a candidate when, with its value lowered by its uncertainty
   (`margin` x value for an estimate, `screen_margin` x value for a screened entry, 0 when exact),
   its reduced cost ΔL[k] − λ·removed[k] is no worse than the pick's. A non-exact pick always is.
4. Measure. With a `screen` callback, estimate-level candidates are screened first and the round
   starts again; then the candidates are measured exactly, substituted, and the round repeats. With
   a `Ladder`, a candidate climbs one rung per round instead (the metric on more of the profiling
   windows, each rung's value rescaled like a screened one and given a narrower margin) and only a
   candidate on the last rung is measured exactly: most candidates stop a rung or two up, having
   cost a fraction of an exact replay.
   It stops when no candidate is left: every pick is exact and, within the margins, no other option
   can beat it, so the next solve returns the same plan.

The table it returns keeps the exact flags (`exact[c]`), and `meta["auto"]` keeps the original
estimate and the screened values, so a second call with another solve (another ratio) measures only
what the new plan needs and has not been measured. Nothing here touches a model: the callbacks do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from gapprune.allocate.table import LossTable
from gapprune.components import COMPONENTS
from gapprune.engine.replay import Entries, Measured

Measure = Callable[[Entries], Measured]
Solve = Callable[[LossTable], dict[str, list[int]]]  # working table -> option index per component and layer

ESTIMATE, SCREENED, PARTIAL, EXACT = 0, 1, 2, 3  # PARTIAL: on a rung of the ladder


@dataclass(frozen=True)
class Ladder:
    """Rungs between the screen and the exact value: the exact metric on more of the profiling windows.

    `measure(entries, windows)` returns ΔL on the first `windows` profiling windows (it replays only
    the windows an entry was not measured on yet); `windows` rise rung by rung below the exact
    table's count, and `margins[i]` is rung i's relative uncertainty, narrower than the screen's as
    more of the windows are in.
    """

    measure: Callable[[Entries, int], Measured]
    windows: tuple[int, ...]
    margins: tuple[float, ...]


_FLOOR = 1e-9  # ΔL below this is treated as this, so ratios stay finite
# Entries exact out of the table's, and no time left: the profile ends when no candidate is left (74 of 510
# entries for the README's job), so a rate times the entries to go would promise ten minutes for seconds.
_BAR = "{desc}: {n}/{total} entries exact [{elapsed}]"


def auto_table(
    estimate: LossTable,
    measure: Measure,
    solve: Solve,
    *,
    screen: Measure | None = None,
    margin: float = 0.25,
    screen_margin: float = 0.25,
    columns: dict[str, list[int]] | None = None,
    max_rounds: int = 30,
    progress: bool = True,
    ladder: Ladder | None = None,
) -> LossTable:
    """A loss table whose entries are exact wherever they can change `solve`'s plan.

    Args:
        estimate: the cheap table (any profiler; `exact[c]` True where already exact, e.g. a table
            returned by an earlier call). Options with nothing removed are exactly 0 and never measured.
        measure: exact ΔL of the listed entries, `{layer: {component: [k, ...]}}` ->
            `{layer: {component: {k: ΔL}}}`: `engine.replay.measure_entries` with the adapter, inputs
            and the options' kept units bound. Called once per round with every
            candidate, so one call per layer replays all of its options together.
        solve: the allocation, working table -> `{component: [k per layer]}` (e.g.
            `lambda t: solver(RatioBudget(0.25), "gap", total, decoder)(t).choice`).
        screen: optional, the same signature as `measure` but cheap and noisier (the exact metric on
            a short prefix of the calibration tokens). Estimates that pass the margin test are
            screened first, and only screened entries that still pass are measured exactly.
        margin: relative uncertainty of a (rescaled) estimate: an entry's lower bound is
            ΔL / (1 + margin). 0 measures only picks (simulated on SmolLM2's Fisher and exact
            tables: 4-9% above the exact optimum's summed ΔL); the default 0.25 lands within 0.65%
            at every ratio from 12.5% to 50% but measures 77-186 entries, 21-47% of the full
            table's cost (docs/auto_profiler.md). Larger measures more and is safer.
        screen_margin: relative uncertainty of a screened entry (default 0.25; not yet calibrated
            on real screening tables, see docs/auto_profiler.md).
        columns: per component, the option indices that may be measured (default: all). The
            other options take values interpolated linearly in parameters removed between the
            nearest such columns of their row, as the exact profiler's `--mlp-stride` does; a pick
            between columns makes its two bracketing columns candidates. Pass the exact
            profiler's grid (`option_grid(...).measured`) to keep its resolution and cost per row.
        max_rounds: a safety bound; every round measures at least one new entry, so the loop ends
            anyway within the table's size.
        progress: a tqdm bar: stage, round, exact entries out of the table's.
        ladder: optional rungs between the estimate and the exact value (see `Ladder`); a candidate
            climbs one per round, the exact `measure` only takes candidates on the last rung.

    Returns:
        A copy of `estimate` with measured values substituted, exact flags set, the working
        estimates elsewhere, and `meta["auto"]` (rounds, entries measured and screened per round,
        the raw estimate and screened values for a later call).
    """
    table = estimate.copy()
    assert table.exact is not None
    state = _State.start(table, columns, ladder)
    total = sum(table.n_layers * int(state.columns[c][1:].sum()) for c in COMPONENTS)  # the measurable grid
    bar = tqdm(total=total, desc="auto ΔL", unit="entry", bar_format=_BAR, disable=not progress)
    bar.update(state.n_exact())
    history: list[dict[str, Any]] = []
    exact_before = state.n_exact()
    round_no, converged = 0, False
    while round_no < max_rounds:
        working = state.working(table)
        tol = {EXACT: 0.0, SCREENED: screen_margin, ESTIMATE: margin}
        plans = [solve(working), solve(state.optimistic(working, tol))]
        lam = lagrange_multiplier(working, plans[0])
        if screen is not None:
            todo = state.candidates(working, plans, lam, tol, levels=(ESTIMATE,))
            if todo:
                bar.set_description_str(f"auto ΔL: screen round {round_no + 1}")
                state.store(screen(todo), SCREENED)
                history.append({"round": round_no + 1, "stage": "screen", "entries": _count(todo)})
                round_no += 1
                continue
        todo = state.candidates(working, plans, lam, tol, levels=(ESTIMATE, SCREENED, PARTIAL))
        if not todo:
            converged = True
            break
        round_no += 1
        bar.set_description_str(f"auto ΔL: round {round_no}")
        steps = state.next_rungs(todo) if ladder is not None else {-1: todo}
        for rung, entries in sorted(steps.items()):  # the exact measurements (-1) first, then the rungs
            if rung < 0:
                state.store(measure(entries), EXACT)
                bar.update(_count(entries))
                stage = "exact"
            else:
                assert ladder is not None
                state.store_rung(ladder.measure(entries, ladder.windows[rung]), rung)
                stage = f"{ladder.windows[rung]} windows"
            history.append({"round": round_no, "stage": stage, "entries": _count(entries)})
    bar.close()
    result = state.working(table)
    saved = estimate.meta.get("auto", {})
    result.meta = dict(estimate.meta)
    result.meta["profiler"] = "auto"
    result.meta["auto"] = {
        "rounds": history, "converged": converged, "margin": margin, "screen_margin": screen_margin,
        **({"ladder": {"windows": list(ladder.windows), "margins": list(ladder.margins)},
            "rung": {c: state.rung[c].tolist() for c in COMPONENTS},
            "on_rung": {c: state.on_rung[c].tolist() for c in COMPONENTS}} if ladder is not None else {}),
        "n_exact_before": exact_before, "n_exact": state.n_exact(), "n_entries": total,
        "estimate": {c: v.tolist() for c, v in state.estimate.items()},
        "screened": {c: np.where(state.level[c] >= SCREENED, state.screened[c], np.nan).tolist() for c in COMPONENTS},
        "estimate_profiler": saved.get("estimate_profiler", estimate.meta.get("profiler")),
    }
    return result


def lagrange_multiplier(table: LossTable, plan: dict[str, list[int]]) -> float:
    """λ ≥ 0 at which each row's argmin of ΔL − λ·removed removes, in all, as much as `plan`.

    The DP's plan is the relaxed plan of some λ up to a few rows (the knapsack is integer), so the
    reduced cost ΔL[k] − λ·removed[k] − (ΔL[pick] − λ·removed[pick]) says how much option k would
    have to drop to enter the plan.
    """
    loss, removed = _padded(table)
    picks = np.concatenate([np.asarray(plan[c]) for c in COMPONENTS])
    target = removed[np.arange(len(picks)), picks].sum()

    def removed_at(lam: float) -> float:
        k = np.argmin(loss - lam * removed, axis=1)
        return float(removed[np.arange(len(k)), k].sum())

    lo, hi = 0.0, 1.0
    while removed_at(hi) < target and hi < 1e30:
        hi *= 4.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if removed_at(mid) >= target else (mid, hi)
        if hi - lo <= 1e-12 * hi:
            break
    return hi


def _padded(table: LossTable) -> tuple[np.ndarray, np.ndarray]:
    """Rows (attn rows, then mlp rows) padded to a common width: (2·n_layers, K_max) loss and removed."""
    width = max(table.loss[c].shape[1] for c in COMPONENTS)
    loss = np.full((0, width), np.inf)
    removed = np.zeros((0, width))
    for c in COMPONENTS:
        pad = width - table.loss[c].shape[1]
        loss = np.vstack([loss, np.pad(table.loss[c], ((0, 0), (0, pad)), constant_values=np.inf)])
        removed = np.vstack([removed, np.pad(table.removed[c].astype(np.float64), ((0, 0), (0, pad)))])
    return loss, removed


def _count(entries: Entries) -> int:
    return sum(len(ks) for per in entries.values() for ks in per.values())


class _State:
    """Per entry: its raw estimate, its level (estimate, screened, on a rung, exact) and its measured values."""

    def __init__(self, estimate: dict[str, np.ndarray], screened: dict[str, np.ndarray],
                 level: dict[str, np.ndarray], exact: dict[str, np.ndarray], columns: dict[str, np.ndarray],
                 rung_margins: tuple[float, ...] = ()) -> None:
        self.estimate, self.screened, self.level, self.exact = estimate, screened, level, exact
        self.columns = columns  # per component, (K,) bool: may be measured
        self.rung_margins = rung_margins
        self.rung = {c: np.full(v.shape, -1) for c, v in level.items()}  # the highest rung reached, -1: none
        self.on_rung = {c: np.full((*v.shape, len(rung_margins)), np.nan) for c, v in level.items()}  # value per rung

    @classmethod
    def start(cls, table: LossTable, columns: dict[str, list[int]] | None, ladder: Ladder | None = None) -> _State:
        """The state `table` was left in: its estimates, screened values and exact entries, and, when an earlier
        call climbed the same ladder, each entry's rungs (so a call with a plan solved before measures nothing)."""
        assert table.exact is not None
        saved = table.meta.get("auto", {})
        allowed = {c: np.ones(table.loss[c].shape[1], dtype=bool) for c in COMPONENTS}
        for c, ks in (columns or {}).items():
            allowed[c][:] = False
            allowed[c][[0, *ks]] = True
        estimate, screened, level, exact = {}, {}, {}, {}
        for c in COMPONENTS:
            shape = table.loss[c].shape
            # an option between columns is exact only as the interpolation of two exact ones (`working`), as
            # it was when the table was made: counted exact here, it would move the rescaling of the others
            exact_c = (table.exact[c] & allowed[c]) | (table.removed[c] == 0)
            est = np.asarray(saved["estimate"][c], dtype=np.float64) if "estimate" in saved \
                else np.where(table.exact[c], np.nan, table.loss[c])  # an exact entry's estimate is unknown
            scr = np.asarray(saved["screened"][c], dtype=np.float64) if "screened" in saved else np.full(shape, np.nan)
            level[c] = np.where(exact_c, EXACT, np.where(np.isnan(scr), ESTIMATE, SCREENED))
            exact[c] = np.where(table.removed[c] == 0, 0.0, table.loss[c])
            estimate[c], screened[c] = est, scr
        state = cls(estimate, screened, level, exact, allowed, ladder.margins if ladder is not None else ())
        same_ladder = ladder is not None and saved.get("ladder", {}).get("windows") == list(ladder.windows)
        if same_ladder and "on_rung" in saved:
            for c in COMPONENTS:
                rung = np.asarray(saved["rung"][c], dtype=np.int64)
                on = (rung >= 0) & (level[c] != EXACT)
                state.rung[c] = np.where(on, rung, -1)
                state.on_rung[c] = np.asarray(saved["on_rung"][c], dtype=np.float64)
                level[c][on] = PARTIAL
        return state

    def n_exact(self) -> int:
        return int(sum(int((self.level[c][:, 1:] == EXACT).sum()) for c in COMPONENTS))

    def store(self, values: Measured, level: int) -> None:
        target = self.exact if level == EXACT else self.screened
        for layer, per in values.items():
            for c, ks in per.items():
                for k, value in ks.items():
                    if self.level[c][layer, k] == EXACT:
                        continue
                    target[c][layer, k] = value
                    self.level[c][layer, k] = level

    def store_rung(self, values: Measured, rung: int) -> None:
        for layer, per in values.items():
            for c, ks in per.items():
                for k, value in ks.items():
                    if self.level[c][layer, k] == EXACT or self.rung[c][layer, k] >= rung:
                        continue
                    self.on_rung[c][layer, k, rung] = value
                    self.rung[c][layer, k] = rung
                    self.level[c][layer, k] = PARTIAL

    def next_rungs(self, entries: Entries) -> dict[int, Entries]:
        """Where each candidate goes this round: the rung above its own (-1: measured exactly)."""
        out: dict[int, Entries] = {}
        top = len(self.rung_margins) - 1
        for layer, per in entries.items():
            for c, ks in per.items():
                for k in ks:
                    reached = int(self.rung[c][layer, k])
                    step = reached + 1 if reached < top else -1
                    out.setdefault(step, {}).setdefault(layer, {}).setdefault(c, []).append(k)
        return out

    def tolerance(self, c: str, tol: dict[int, float]) -> np.ndarray:
        """Each entry's relative uncertainty: by level, and on the ladder by its rung."""
        out = np.vectorize(lambda level: tol.get(level, 0.0), otypes=[float])(self.level[c])
        if self.rung_margins:
            on = self.level[c] == PARTIAL
            out[on] = np.asarray(self.rung_margins)[self.rung[c][on]]
        return out

    def working(self, table: LossTable) -> LossTable:
        """The table the plan is solved on: exact, else screened, else rescaled estimate."""
        out = table.copy()
        assert out.exact is not None
        for c in COMPONENTS:
            lvl = self.level[c]
            out.loss[c] = np.where(lvl == EXACT, self.exact[c],
                                   np.where(lvl == SCREENED, self._rescaled(c, self.screened[c]),
                                            self._rescaled(c, self.estimate[c])))
            for rung in range(len(self.rung_margins)):
                on = (lvl == PARTIAL) & (self.rung[c] == rung)
                if on.any():
                    out.loss[c][on] = self._rescaled(c, self.on_rung[c][..., rung])[on]
            out.exact[c] = lvl == EXACT
            cols = np.flatnonzero(self.columns[c])
            if cols.size < self.columns[c].size:
                for layer in range(out.loss[c].shape[0]):
                    removed = out.removed[c][layer].astype(np.float64)
                    between = ~self.columns[c] & (lvl[layer] != EXACT)
                    out.loss[c][layer, between] = np.interp(removed[between], removed[cols], out.loss[c][layer, cols])
                    # between two exact columns the value is the exact profiler's own interpolation: exact as that is
                    ks = np.flatnonzero(between)
                    right = np.minimum(np.searchsorted(cols, ks), cols.size - 1)
                    left = np.maximum(right - 1, 0)
                    out.exact[c][layer, ks] = (lvl[layer, cols[left]] == EXACT) & (lvl[layer, cols[right]] == EXACT)
        return out

    def _rescaled(self, c: str, source: np.ndarray) -> np.ndarray:
        """`source` (estimates or screened values) times the exact/source ratio, interpolated along
        each row in log space between the row's exact entries that also have a source value."""
        est = np.maximum(np.nan_to_num(source, nan=_FLOOR), _FLOOR)
        known = (self.level[c] == EXACT) & ~np.isnan(source) & (self.exact[c] > _FLOOR)
        known[:, 0] = False
        log_ratio = np.where(known, np.log(np.maximum(self.exact[c], _FLOOR) / est), 0.0)
        fallback = float(np.median(log_ratio[known])) if known.any() else 0.0
        out = np.empty_like(est)
        columns = np.arange(est.shape[1])
        for layer in range(est.shape[0]):
            idx = np.flatnonzero(known[layer])
            row = np.interp(columns, idx, log_ratio[layer, idx]) if idx.size else np.full(est.shape[1], fallback)
            out[layer] = est[layer] * np.exp(row)
        return out

    def optimistic(self, working: LossTable, tol: dict[int, float]) -> LossTable:
        """Every entry lowered to the bottom of its uncertainty: ΔL / (1 + tol[level])."""
        out = working.copy()
        for c in COMPONENTS:
            out.loss[c] = working.loss[c] / (1.0 + self.tolerance(c, tol))
        return out

    def candidates(self, working: LossTable, plans: list[dict[str, list[int]]], lam: float,
                   tol: dict[int, float], levels: tuple[int, ...]) -> Entries:
        """Entries at one of `levels` that could beat their row's pick, or that a plan picks.

        `plans[0]` is the plan on the working table; the others (the optimistic plan) only add
        their picks. An entry passes the margin test when its reduced cost against the pick, with
        its ΔL divided by 1 + tol[level], is not positive.
        """
        todo: Entries = {}
        for c in COMPONENTS:
            loss, removed, lvl = working.loss[c], working.removed[c].astype(np.float64), self.level[c]
            low = loss / (1.0 + self.tolerance(c, tol))
            open_ = np.isin(lvl, levels) & self.columns[c]
            cols = np.flatnonzero(self.columns[c])
            for layer, pick in enumerate(plans[0][c]):
                pick_value = loss[layer, pick] - lam * removed[layer, pick]
                hit = (low[layer] - lam * removed[layer] <= pick_value) & open_[layer]
                for plan in plans:
                    k = plan[c][layer]
                    near = [k] if self.columns[c][k] else [cols[cols < k].max(), cols[cols > k].min()]
                    for j in near:
                        hit[j] |= bool(open_[layer, j])
                ks = [int(k) for k in np.flatnonzero(hit)]
                if ks:
                    todo.setdefault(layer, {})[c] = ks
        return dict(sorted(todo.items()))
