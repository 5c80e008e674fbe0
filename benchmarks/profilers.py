"""The auto profiler against the exact table at the CLI's defaults, and the LM head's logsumexp tiles.

    python benchmarks/profilers.py screen --data-dir ../shared/data --ratios 0.25,0.5 --variants float32:1,bfloat16:1
    python benchmarks/profilers.py screen --data-dir ../shared/data --variants bfloat16:1 --exact runs/exact.json
    python benchmarks/profilers.py tiles --threads 2
    python benchmarks/profilers.py kernels --threads 2 --data-dir ../shared/data
    python benchmarks/profilers.py margins --data-dir ../shared/data --tables runs/margins --margins 0,0.05,0.1
    python benchmarks/profilers.py margins --data-dir ../shared/data --tables runs/margins --margins 0.1,0.2 --ladder
    python benchmarks/profilers.py margins --data-dir ../shared/data --tables runs/margins --margins 0.2 --ladder --rungs '2,4;4'

`screen`: the exact table's profiling time, then the auto profiler per screen variant
(precision:stride) and ratio from fresh checkpoints, each plan scored by its summed ΔL on that one
exact table. `tiles`: a replay's logsumexp (`engine.head.logsumexp_logits`) at several tile shapes,
for SmolLM2's and Qwen2.5-1.5B's heads. `kernels`: one OBS pass over an 8,960-wide MLP (Qwen2.5-1.5B's)
with H⁻¹ updated at every step or deferred, its Gram whole or by the upper triangle, and a linear
layer's GFLOP/s in float32 and bfloat16; with `--data-dir`, also SmolLM2's OBS options against float64's, the CLI's screen in both precisions and a replay's
cost by options per pass. `margins`: the auto profiler's rounds replayed offline on one exact
table and one screen (each measured once, kept in `--tables`), per ratio and margin: the entries it
measures exactly, their replay cost as a share of the exact table's, and the plan's summed exact ΔL (and per ratio
the floor: the share of the exact optimum's own entries); `--screen 2x64`
screens the first 64 tokens of two windows instead of one whole window; `--ladder` runs the CLI's ladder (rungs of 2
and 4 windows, or `--rungs`) on per-window tables. The finished studies' modes (timing, layers, calib, auto)
are in history: `git show fab99f7:benchmarks/profilers.py`.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import torch
from common import ResultLog, bf16_flags

from gapprune.allocate import LayerSignals, LossTable
from gapprune.api import load
from gapprune.budget import RatioBudget, solver
from gapprune.calibrate.gram import add_upper_, mirror_upper_, upper_blocks
from gapprune.config import PruneConfig
from gapprune.engine import head as head_module
from gapprune.engine.capture import capture_layer_inputs
from gapprune.engine.head import dense_reference
from gapprune.engine.replay import replay_stacked
from gapprune.evaluate.timing import median_seconds
from gapprune.importance.obs import CHANNEL_BLOCKS, channel_order, compacting_order, damped_inverse, obs_order
from gapprune.models import COMPONENTS
from gapprune.pipeline import Profile, allocate, calibrate, plan_for
from gapprune.profiling.auto import auto_table
from gapprune.profiling.auto_measure import ladder_of, screen_table
from gapprune.profiling.exact import step_of
from gapprune.profiling.loss_table import option_grid
from gapprune.profiling.profilers import measure_table

HEAD_IN_LAYERS = 11  # a replay's LM head and logsumexp cost about 11 SmolLM2 decoder layers (performance.md §1)


def screen(args: argparse.Namespace, emit) -> None:  # type: ignore[no-untyped-def]
    """The CLI's defaults: the exact table timed, then `auto` per variant (screen precision:stride) and
    ratio from fresh checkpoints; every plan scored by its summed ΔL on that one exact table."""
    torch.set_num_threads(args.threads)
    model, tokenizer = load(args.model)
    config = PruneConfig(ratio=0.25, data_dir=args.data_dir)
    calibration = calibrate(model, tokenizer, config)

    def timed_exact() -> LossTable:
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as folder:
            table = measure_table(calibration, replace(config, profiler="exact"), Path(folder))
        table.meta["wall_s"] = round(time.perf_counter() - start, 1)
        return table

    exact = kept_table(Path(args.exact), timed_exact) if args.exact else timed_exact()
    exact_s = exact.meta["wall_s"]
    total = sum(p.numel() for p in model.parameters())

    def summed(choice: dict[str, list[int]]) -> float:
        return sum(float(exact.loss[c][layer, k]) for c in choice for layer, k in enumerate(choice[c]))

    for ratio in map(float, args.ratios.split(",")):
        exact_plan = allocate(Profile(calibration.unit_scores, LayerSignals(), exact, total), ratio, "gap").choice
        for variant in args.variants.split(","):
            precision, stride = variant.split(":")
            variant_config = replace(config, ratio=ratio, screen_precision=precision, screen_stride=int(stride))
            with tempfile.TemporaryDirectory() as folder:
                timings: dict[str, float] = {}
                plan, profile = plan_for(variant_config, calibration, checkpoint_dir=Path(folder), timings=timings)
            choice, meta = plan.summary["choice"], profile.table.meta["auto"]
            emit({"kind": "auto_vs_exact", "profiler": "auto", "ratio": ratio, "screen_precision": precision,
                  "screen_stride": int(stride), "threads": args.threads, "wall_s": timings["profiling"],
                  "exact_wall_s": exact_s, "share_of_exact": round(timings["profiling"] / exact_s, 3),
                  "summed_dl_exact": round(summed(choice), 6), "exact_summed_dl_exact": round(summed(exact_plan), 6),
                  "same_components_as_exact_plan": sum(a == b for c in COMPONENTS
                                                       for a, b in zip(choice[c], exact_plan[c], strict=True)),
                  "exact_replays": sum(r["entries"] for r in meta["rounds"] if r["stage"] == "exact"),
                  "rung_replays": sum(r["entries"] for r in meta["rounds"] if r["stage"].endswith("windows")),
                  "rounds": meta["rounds"],
                  "note": "wall_s and exact_wall_s: profiling alone (plan_for's phase; the exact table's measure_table)"})


def margins(args: argparse.Namespace, emit) -> None:  # type: ignore[no-untyped-def]
    """Auto's rounds on a lookup of the exact table: what each margin measures and what its plan loses."""
    torch.set_num_threads(args.threads)
    model, tokenizer = load(args.model)
    config = PruneConfig(ratio=0.25, data_dir=args.data_dir)
    calibration = calibrate(model, tokenizer, config)
    folder = Path(args.tables)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        exact = kept_table(folder / "exact.json", lambda: measure_table(calibration, replace(config, profiler="exact"),
                                                                           Path(scratch)))
    windows, tokens = map(int, args.screen.split("x"))
    if (windows, tokens) == (config.screen_samples, config.seq_len):  # the CLI's screen
        screen = kept_table(folder / "screen.json", lambda: screen_table(calibration, config))
    else:
        screen = kept_table(folder / f"screen-{args.screen}.json",
                            lambda: prefix_screen(calibration, config, windows, tokens))
    adapter = calibration.adapter
    grid = option_grid(adapter, step_of(adapter, config), config.mlp_stride)
    total, decoder = sum(p.numel() for p in model.parameters()), adapter.decoder_params()

    def cost(layer: int) -> int:  # one option's replay: the layers from `layer` on, and the head
        return adapter.n_layers - layer + HEAD_IN_LAYERS

    table_cost = sum(cost(layer) * (len(ks) - (0 in ks)) for c, ks in grid.measured.items() for layer in range(adapter.n_layers))

    def measure(entries):  # type: ignore[no-untyped-def]
        return {layer: {c: {k: float(exact.loss[c][layer, k]) for k in ks} for c, ks in per.items()}
                for layer, per in entries.items()}

    def summed(choice: dict[str, list[int]]) -> float:
        return sum(float(exact.loss[c][layer, k]) for c in choice for layer, k in enumerate(choice[c]))

    emit({"kind": "auto_screen_error", "model": args.model, "screen": args.screen,
          **screen_errors(exact, screen, grid.measured),
          "note": "|rescaled screen / exact - 1| over the grid's columns, the screen rescaled by the exact/screen "
          "ratio of one other column of the same row (distance 1: the adjacent column), as the auto profiler "
          "rescales around a measured entry"})
    windows = calibration.profile_inputs.n_windows
    per_window = [kept_table(folder / f"window-{w}.json",  # each profiling window's exact table, for the ladder
                             partial(screen_table, calibration, config, calibration.profile_inputs.windows(w, w + 1)))
                  for w in range(windows)] if args.ladder else []
    for ratio in map(float, args.ratios.split(",")):
        solve = choices_of(solver(RatioBudget(ratio), "gap", total, decoder))
        optimum = solve(exact)
        best = summed(optimum)
        floor = [layer for c in optimum for layer, k in enumerate(optimum[c])  # what an oracle measures alone
                 for _ in bracket(grid.measured[c], k)]
        emit({"kind": "auto_floor", "model": args.model, "ratio": ratio, "exact_entries": len(floor),
              "replay_share": round(sum(map(cost, floor)) / table_cost, 4), "threads": args.threads,
              "note": "the exact optimum's chosen entries (nothing removed excluded; a pick between the grid's columns counts its two bracketing columns): what a profiler that knew the "
              "plan would still replay to certify it, weighed as auto_margin's replay_share; the 128-token screen "
              "costs 1/8 of the table on top"})
        for margin in map(float, args.margins.split(",")):
            for rungs in (args.rungs.split(";") if per_window else []):
                done, ladder, reached = with_ladder(per_window, exact, config, solve, grid.measured, margin, rungs)
                emit({"kind": "auto_margin", "model": args.model, "screen": args.screen, "ladder": list(ladder.windows),
                      "ladder_margins": [round(m, 4) for m in ladder.margins], "ratio": ratio, "margin": margin,
                      "exact_entries": sum(w == len(per_window) for w in reached.values()),
                      "rung_entries": sum(w < len(per_window) for w in reached.values()),
                      "replay_share": round(sum(cost(key[0]) * (w - 1) / len(per_window) for key, w in reached.items())
                                            / table_cost, 4),
                      "replay_share_bf16_screen": round(sum(cost(key[0]) * (w - (w < len(per_window))) / len(per_window)
                                                            for key, w in reached.items()) / table_cost, 4),
                      "rounds": len(done.meta["auto"]["rounds"]), "summed_dl_exact": round(summed(solve(done)), 6),
                      "exact_summed_dl_exact": round(best, 6), "over_exact_optimum": round(summed(solve(done)) / best - 1, 5),
                      "threads": args.threads, "note": "offline: the rungs read per-window tables (each window's "
                      "table at the screen's precision), the exact rounds the exact table; replay_share counts the "
                      f"windows each entry replayed beyond the screen's, an entry at layer l weighing L - l + {HEAD_IN_LAYERS} "
                      "per whole replay; _bf16_screen adds the screen's window replayed again in float32 for an exact "
                      "value, as after a bf16 screen; the screen's 1/8 of the table not included"})
            if per_window:
                continue
            done = auto_table(screen, measure, solve, columns=grid.measured, margin=margin, progress=False)
            assert done.exact is not None
            plan = solve(done)
            measured = [(c, layer) for c in done.exact for layer, k in zip(*done.exact[c].nonzero(), strict=True)
                        if k in grid.measured[c] and k != 0]
            emit({"kind": "auto_margin", "model": args.model, "screen": args.screen, "ratio": ratio, "margin": margin,
                  "exact_entries": len(measured), "replay_share": round(sum(cost(int(l)) for _, l in measured) / table_cost, 4),
                  "rounds": len(done.meta["auto"]["rounds"]), "summed_dl_exact": round(summed(plan), 6),
                  "exact_summed_dl_exact": round(best, 6), "over_exact_optimum": round(summed(plan) / best - 1, 5),
                  "threads": args.threads, "note": "offline: the exact rounds read the exact table; replay_share "
                  f"weighs an entry at layer l by L - l + {HEAD_IN_LAYERS} (the head in decoder layers), the "
                  "screen's cost (about 1/8 of the table) not included"})


def with_ladder(per_window: list[LossTable], exact: LossTable, config: PruneConfig, solve, columns, margin: float,  # type: ignore[no-untyped-def]
                rungs: str = ""):
    """Auto with a ladder, offline: a rung's value is the mean of the first windows' tables, the exact value the
    exact table's. `rungs`: the rungs' windows, e.g. "2,4,6" (empty: the CLI's, `ladder_of`). Returns the completed
    table, the ladder, and the windows each entry was measured on."""
    n = len(per_window)
    reached: dict[tuple[int, str, int], int] = {}

    def on_windows(entries, windows):  # type: ignore[no-untyped-def]
        for layer, per in entries.items():
            for c, ks in per.items():
                for k in ks:
                    reached[layer, c, k] = max(reached.get((layer, c, k), 1), windows)
        return {layer: {c: {k: float(np.mean([t.loss[c][layer, k] for t in per_window[:windows]]) if windows < n
                                     else exact.loss[c][layer, k]) for k in ks}
                        for c, ks in per.items()} for layer, per in entries.items()}

    ladder = ladder_of(replace(config, auto_margin=margin), n, on_windows)
    if rungs and ladder is not None:  # the same margins' rule, √(1/w − 1/n) against the screen's, at other rungs
        windows = tuple(int(w) for w in rungs.split(","))
        ladder = replace(ladder, windows=windows,
                         margins=tuple(margin * math.sqrt(1 / w - 1 / n) / math.sqrt(1 - 1 / n) for w in windows))
    done = auto_table(per_window[0], lambda entries: on_windows(entries, n), solve, columns=columns, margin=margin,
                      progress=False, ladder=ladder)
    return done, ladder, reached


def prefix_screen(calibration, config: PruneConfig, windows: int, tokens: int) -> LossTable:  # type: ignore[no-untyped-def]
    """The CLI's screen on the first `tokens` of each of the first `windows` profiling windows (the same token count
    as one whole window spread over more text), its layer inputs captured afresh for that length."""
    inputs = capture_layer_inputs(calibration.adapter, calibration.ids[:windows, :tokens], progress=False)
    return screen_table(calibration, config, inputs)


def screen_errors(exact: LossTable, screen: LossTable, columns: dict[str, list[int]]) -> dict[str, float]:
    """Median and 90th percentile of the screen's relative error, raw and rescaled by an adjacent exact column."""
    out = {}
    for c, ks in columns.items():
        ks = [k for k in ks if k]
        e, s = exact.loss[c][:, ks], screen.loss[c][:, ks]
        ok = (e > 1e-9) & (s > 1e-9)
        raw = np.abs(s[ok] / e[ok] - 1)
        near = np.abs((s[:, :-1] * (e[:, 1:] / s[:, 1:]))[ok[:, :-1] & ok[:, 1:]] / e[:, :-1][ok[:, :-1] & ok[:, 1:]] - 1)
        for name, values in (("raw", raw), ("adjacent", near)):
            out[f"{c}_{name}_median"] = round(float(np.median(values)), 4)
            out[f"{c}_{name}_p90"] = round(float(np.percentile(values, 90)), 4)
    return out


def bracket(columns: list[int], k: int) -> list[int]:
    """The measured columns option k's value rests on: k on the grid, else the two around it; never option 0."""
    around = [k] if k in columns else [max(c for c in columns if c < k), min(c for c in columns if c > k)]
    return [c for c in around if c != 0]


def choices_of(solve):  # type: ignore[no-untyped-def]
    """A table solver that returns the option index per component and layer (what auto_table takes)."""
    return lambda table: solve(table).choice


def kept_table(path: Path, measure) -> LossTable:  # type: ignore[no-untyped-def]
    """The table at `path`, measured and written there first if it is not."""
    if not path.is_file():
        path.write_text(json.dumps(measure().to_dict()))
    return LossTable.from_dict(json.loads(path.read_text()))


def tiles(args: argparse.Namespace, emit) -> None:  # type: ignore[no-untyped-def]
    """A replay's logsumexp over a random head in tiles of rows x vocabulary slice: seconds per call."""
    torch.set_num_threads(args.threads)
    for vocab, hidden, rows in [(49_152, 576, 4096), (151_936, 1536, 2048)]:  # SmolLM2-135M, Qwen2.5-1.5B
        head, normed = torch.nn.Linear(hidden, vocab, bias=False), torch.randn(rows, hidden)
        for tile_rows, elements in [(2048, 1 << 24), (1024, 1 << 21), (1024, 1 << 20), (512, 1 << 20)]:
            head_module.LSE_TILE_ELEMENTS = {"cpu": elements}
            seconds = median_seconds(partial(head_module.logsumexp_logits, normed, head, tile_rows), repeats=3)
            emit({"kind": "lse_tiles", "vocab": vocab, "hidden": hidden, "rows": rows, "tile_rows": tile_rows,
                  "tile_vocab": elements // tile_rows, "seconds": round(seconds, 3), "threads": args.threads})


def options(order: list[int], step: int) -> list[set[int]]:
    """The channel sets an OBS order removes at each option (every `step` channels)."""
    return [set(order[:k]) for k in range(step, len(order), step)]


def kernels(args: argparse.Namespace, emit) -> None:  # type: ignore[no-untyped-def]
    """OBS's channel pass, compacting every step against deferred, and float32 against bfloat16 matmuls."""
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    width, tokens, out, per_step, step = 8960, 4096, 1536, 140, 280  # Qwen2.5-1.5B's MLP, CLI defaults
    x = torch.randn(tokens, width, generator=g) * torch.rand(width, generator=g)
    gram, weight = x.T @ x, torch.randn(out, width, generator=g)
    reference = options(channel_order(weight, damped_inverse(gram, torch.float64), per_step), step)
    for name, order_of in (("compacting", partial(compacting_order, width=1)), ("deferred", channel_order)):
        start = time.perf_counter()
        order = order_of(weight, damped_inverse(gram, torch.float32), per_step=per_step)
        emit({"kind": "obs_layer", "pass": name, "width": width, "tokens": tokens, "per_step": per_step,
              "seconds": round(time.perf_counter() - start, 2), "threads": args.threads,
              "options_as_float64": sum(a == b for a, b in zip(options(order, step), reference, strict=True)),
              "options": len(reference)})
    whole = torch.zeros(width, width)
    for name in ("whole", "upper"):  # the Gram of 4,096 tokens in batches of 1,024, as the calibration pass takes it
        target = torch.zeros(width, width)
        start = time.perf_counter()
        for batch in x.split(1024):
            if name == "upper":
                add_upper_(target, batch)
            else:
                target += batch.T @ batch
        if name == "upper":
            mirror_upper_(target)
        else:
            whole.copy_(target)
        emit({"kind": "gram_upper", "product": name, "width": width, "tokens": tokens, "batch": 1024,
              "blocks": len(upper_blocks(width)) if name == "upper" else 1, "threads": args.threads,
              "seconds": round(time.perf_counter() - start, 2), "equal_to_whole": bool(torch.equal(target, whole))})
    for rows, (n_out, n_in) in [(1024, (1536, 576)), (1024, (576, 1536)), (1024, (49_152, 576))]:  # SmolLM2's
        a, w = torch.randn(rows, n_in), torch.randn(n_out, n_in)
        for dtype in (torch.float32, torch.bfloat16):
            seconds = median_seconds(partial(torch.nn.functional.linear, a.to(dtype), w.to(dtype)), repeats=5)
            emit({"kind": "matmul", "dtype": str(dtype).removeprefix("torch."), "rows": rows, "out": n_out,
                  "in": n_in, "gflops": round(2 * rows * n_out * n_in / seconds / 1e9, 1), "threads": args.threads,
                  "cpu_flags": bf16_flags()})
    if args.data_dir is None:
        return
    model, tokenizer = load(args.model)
    config = PruneConfig(ratio=0.25, data_dir=args.data_dir)
    calibration = calibrate(model, tokenizer, config)
    adapter, grams, step = calibration.adapter, calibration.gram, step_of(calibration.adapter, config)
    assert grams is not None
    agree = {"deferred": 0, "compacting": 0}  # the CLI's OBS options against a float64 pass, per MLP layer
    for layer in range(adapter.n_layers):
        key, weight = (layer, "mlp"), adapter.out_proj(layer, "mlp").weight
        grams.ensure(layer, key)
        per_step = max(1, weight.shape[1] // CHANNEL_BLOCKS)
        reference = options(obs_order(weight, [grams.fit[key], grams.held_out[key]], 1, per_step, torch.float64), step)
        ours = calibration.unit_scores.get(layer, "mlp").argsort().tolist()
        old = compacting_order(weight, damped_inverse([grams.fit[key], grams.held_out[key]], torch.float32), 1, per_step)
        agree["deferred"] += options(ours, step) == reference
        agree["compacting"] += options(old, step) == reference
    emit({"kind": "obs_float64", "model": args.model, "layers": adapter.n_layers, "layers_as_float64": agree,
          "note": "MLP layers whose OBS option sets (every channel_step channels) equal a float64 pass's: the CLI's "
          "scores (deferred, float32) and the pass updating H⁻¹ at every step in float32"})
    for precision in ("float32", "bfloat16"):  # the CLI's screen, whole
        start = time.perf_counter()
        screen_table(calibration, replace(config, screen_precision=precision))
        emit({"kind": "screen_precision", "model": args.model, "precision": precision, "threads": args.threads,
              "cpu_flags": bf16_flags(),
              "seconds": round(time.perf_counter() - start, 1)})
    inputs = calibration.profile_inputs.first(1)
    reference = dense_reference(adapter, inputs, config.metric, torch.device("cpu"))
    kept = [list(range(adapter.layer_shape(0).intermediate // 2))] * 32
    for per_pass in (1, 4, 8, 16, 32):  # 32 MLP options from layer 0 on one window, so many to a pass
        run = lambda per_pass=per_pass: [replay_stacked(adapter, inputs, 0, "mlp", kept[i : i + per_pass],
                                                        reference, torch.device("cpu")) for i in range(0, 32, per_pass)]
        with torch.inference_mode():
            seconds = median_seconds(run, repeats=3)
        emit({"kind": "replay_pass", "model": args.model, "options": 32, "per_pass": per_pass, "windows": 1,
              "start_layer": 0, "threads": args.threads, "seconds": round(seconds, 2)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["screen", "tiles", "margins", "kernels"])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--ratios", default="0.25,0.5", help="screen: ratios to plan for")
    parser.add_argument("--variants", default="float32:1", help="screen: screen precision:stride, comma-separated")
    parser.add_argument("--exact", default=None, help="screen: keep the timed exact table in this file and reuse it "
                        "(its time is the day's measurement; rerun without it on another day or machine)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--tables", default="runs/margins", help="margins: where the exact table and the screen are kept")
    parser.add_argument("--margins", default="0,0.05,0.1", help="margins: auto margins to replay")
    parser.add_argument("--screen", default="1x128", help="margins: the screen's windows x tokens (1x128: the CLI's; "
                        "e.g. 2x64, the first 64 tokens of two windows)")
    parser.add_argument("--ladder", action="store_true", help="margins: auto with the CLI's ladder (rungs of 2 and 4 "
                        "windows), from per-window exact tables kept in --tables")
    parser.add_argument("--rungs", default="", help="margins, with --ladder: other ladders to replay, e.g. '2,4;2,4,6;4' "
                        "(empty: the CLI's)")
    parser.add_argument("--out", default="docs/results/performance.json")
    args = parser.parse_args()
    log = ResultLog(args.out)
    {"screen": screen, "tiles": tiles, "margins": margins, "kernels": kernels}[args.mode](args, log.emit)


if __name__ == "__main__":
    main()
