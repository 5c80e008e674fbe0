"""Profilers on SmolLM2-135M: where the time goes, exact (reference vs batched) vs Fisher, calibration size.

`timing`: at one calibration size (default 1,024 tokens = the default 8 windows x 128), the cost of
the profiler's parts, the wall time of the reference, batched-exact and Fisher profilers, how far
their tables agree, and WikiText-2 perplexity of the GAP plans at 25% and 50% from each table.
`layers`: the reference and the batched exact profiler on the same few start layers, one after the other.
`calib`: tables at several calibration sizes (exact and Fisher, optionally bf16), how stable the
ranking and the plans are against the largest size, and the perplexity of each plan.
Plans are applied without compensation so that only the table differs.
`auto`: `--profiler auto` against `--profiler exact`: for each ratio the README's command (`gapprune
prune smollm2-135m --ratio R --out DIR`, no --eval: profile + DP + surgery + compensation + save) is
timed end to end as a user runs it, with each profiler. The exact table does not depend on the ratio,
so with `--reuse-exact` only the first ratio profiles exactly and the others time the same command
with `--profile` pointing at that folder, adding the measured profiling time (said in the record).
`--exact-table FILE` takes an exact loss_table.json measured before (same model and settings): each
auto run's profile folder gets it in place of its own table, and the exact plan is pruned from there
(`--profile`), its profiling time taken from the table's own `wall_s`. Then both plans' WikiText-2
perplexity (first 256 windows of 128 tokens) is measured.

    python benchmarks/profilers.py timing --data-dir ../shared/data --out docs/results/performance.json
    python benchmarks/profilers.py calib --device cuda --tokens 512,1024,2048,4096,8192 --out calib.json
    python benchmarks/profilers.py auto --data-dir ../shared/data --out docs/results/performance.json
    python benchmarks/profilers.py screen --data-dir ../shared/data --ratios 0.25,0.5 --variants float32:1,bfloat16:1

`screen`: at the CLI's defaults, the exact table's profiling time, then the auto profiler per screen
variant (precision:stride) and ratio, each plan scored by summed ΔL on that exact table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import CALIBRATION, ResultLog, Window, bench_config, perplexity

from gapprune.allocate import LayerSignals, LossTable
from gapprune.api import load, pruned_copy
from gapprune.engine.capture import move_kwargs, run_layer
from gapprune.engine.head import dense_reference, logsumexp_logits
from gapprune.evaluate.timing import median_seconds, synchronize
from gapprune.models import COMPONENTS
from gapprune.options import default_channel_step
from gapprune.pipeline import Profile, allocate, calibrate_on, calibration_ids, plan_for
from gapprune.profiling.batched import build_loss_table_batched
from gapprune.profiling.fisher import build_loss_table_fisher, rank_correlation
from gapprune.profiling.loss_table import build_loss_table

BATCH = CALIBRATION["batch_size"]  # windows per forward pass: 512 tokens
SEQ_LEN = CALIBRATION["seq_len"]
MLP_STRIDE = CALIBRATION["mlp_stride"]
RATIOS = [0.25, 0.5]


class Study:
    """The dense model, its calibration inputs and scores, and helpers to turn a table into numbers."""

    def __init__(self, args: argparse.Namespace, windows: int) -> None:
        self.args = args
        self.device = torch.device(args.device)
        self.model, self.tokenizer = load(args.model, device=args.device)
        self.config = bench_config(args.data_dir, calib_samples=windows, profile_samples=windows, batch_size=BATCH,
                                   device=args.device)
        self.calibration = calibrate_on(self.model, calibration_ids(self.model, self.tokenizer, self.config), self.config)
        self.adapter, self.ids, self.scores = self.calibration.adapter, self.calibration.ids, self.calibration.scores
        self.step = default_channel_step(self.adapter.layer_shape(0).intermediate)
        self.total = sum(p.numel() for p in self.model.parameters())
        self.ppl_cache: dict[tuple, float] = {}

    def prefix(self, tokens: int):  # type: ignore[no-untyped-def]
        return self.calibration.inputs.prefix(tokens // (BATCH * SEQ_LEN))

    def exact(self, tokens: int, precision: str = "float32") -> LossTable:
        return build_loss_table_batched(self.adapter, self.prefix(tokens), self.scores, channel_step=self.step,
                                        mlp_stride=MLP_STRIDE, precision=precision, max_rows=self.args.max_rows,
                                        progress=False)

    def fisher(self, tokens: int) -> LossTable:
        return build_loss_table_fisher(self.adapter, self.ids[: tokens // SEQ_LEN], self.scores, channel_step=self.step,
                                       batch_size=BATCH, progress=False)

    def profile(self, table: LossTable) -> Profile:
        """GAP reads the table alone: the baselines' signals stay empty."""
        return Profile(self.scores, LayerSignals(), table, self.total)

    def plan_choice(self, table: LossTable, ratio: float) -> dict[str, list[int]]:
        return allocate(self.profile(table), ratio, "gap").choice

    def ppl(self, table: LossTable, ratio: float) -> float:
        choice = self.plan_choice(table, ratio)
        key = (ratio, json.dumps(choice))
        if key not in self.ppl_cache:
            plan, _ = plan_for(self.config, None, self.profile(table), adapter=self.adapter, ratio=ratio)
            pruned, _ = pruned_copy(self.model, plan)
            self.ppl_cache[key] = perplexity(pruned, self.tokenizer, Window("wikitext2", SEQ_LEN, self.args.windows),
                                             self.args.data_dir)["ppl"]
        return self.ppl_cache[key]


def agreement(a: dict[str, list[int]], b: dict[str, list[int]]) -> float:
    """Fraction of components (layer x attn/mlp) given the same option by two plans."""
    same = sum(x == y for c in COMPONENTS for x, y in zip(a[c], b[c], strict=True))
    return same / sum(len(a[c]) for c in COMPONENTS)


@torch.inference_mode()
def breakdown(study: Study, tokens: int) -> dict[str, Any]:
    """Seconds per calibration pass of `tokens` tokens for each part of one option's replay."""
    adapter, device, inputs = study.adapter, study.device, study.prefix(tokens)
    batches = inputs.n_batches
    hidden = inputs.hidden[0][0].to(device)
    kwargs = move_kwargs(inputs.kwargs[0][0], device)
    layer_s = median_seconds(lambda: run_layer(adapter.layers[0], hidden, kwargs), device=device) * batches
    norm, head = adapter.final_norm(), adapter.lm_head()
    final = inputs.final_hidden[0].to(device)
    matmul_s = median_seconds(lambda: head(norm(final)), device=device) * batches
    log_p = torch.log_softmax(head(norm(final)).float(), dim=-1)  # the dense side of a full-logit KL, (B, T, V)

    def full_logit_kl() -> torch.Tensor:  # what a replay costs when the KL is taken on full logits
        return (log_p.exp() * (log_p - torch.log_softmax(head(norm(final)).float(), dim=-1))).sum()

    ref_metric_s = median_seconds(full_logit_kl, device=device) * batches
    flat = norm(final).reshape(-1, final.shape[-1])
    lse_s = median_seconds(lambda: logsumexp_logits(flat, head, 512), device=device) * batches
    L = adapter.n_layers
    return {
        "layer_forward_s": round(layer_s, 4), "head_matmul_s": round(matmul_s, 4),
        "reference_head_and_kl_s": round(ref_metric_s, 4), "batched_head_lse_s": round(lse_s, 4),
        "replay_from_middle_s": round(L / 2 * layer_s + ref_metric_s, 4),
        "share_layers_in_reference_replay": round(L / 2 * layer_s / (L / 2 * layer_s + ref_metric_s), 3),
    }


def timing(args: argparse.Namespace, emit) -> None:  # type: ignore[no-untyped-def]
    tokens = args.tokens[0]
    study = Study(args, max(tokens, args.fisher_tokens) // SEQ_LEN)
    emit({"kind": "breakdown", "tokens": tokens, **breakdown(study, tokens)})
    tables: dict[str, LossTable] = {}
    if not args.skip_reference:
        start = time.perf_counter()
        tables["reference"] = build_loss_table(study.adapter, study.prefix(tokens), study.scores, channel_step=study.step,
                                               mlp_stride=MLP_STRIDE)
        emit({"profiler": "reference", "tokens": tokens, "wall_s": round(time.perf_counter() - start, 1)})
    start = time.perf_counter()
    tables["exact"] = study.exact(tokens)
    emit({"profiler": "exact", "tokens": tokens, "wall_s": round(time.perf_counter() - start, 1),
          "options_per_pass": tables["exact"].meta["options_per_pass"]})
    for fisher_tokens in sorted({tokens, args.fisher_tokens}):
        start = time.perf_counter()
        tables[f"fisher@{fisher_tokens}"] = study.fisher(fisher_tokens)
        emit({"profiler": "fisher", "tokens": fisher_tokens, "wall_s": round(time.perf_counter() - start, 1)})
    if "reference" in tables:
        diff = max(float(np.abs(tables["reference"].loss[c] - tables["exact"].loss[c]).max()) for c in COMPONENTS)
        emit({"compare": "reference vs exact", "max_abs_diff": diff,
              "spearman": rank_correlation(tables["reference"], tables["exact"]),
              "same_plan": {str(r): study.plan_choice(tables["reference"], r) == study.plan_choice(tables["exact"], r)
                            for r in RATIOS}})
    for name, table in tables.items():
        if name.startswith("fisher"):
            emit({"compare": f"exact vs {name}", "tokens": tokens, "spearman": rank_correlation(tables["exact"], table),
                  "plan_agreement": {str(r): agreement(study.plan_choice(tables["exact"], r), study.plan_choice(table, r))
                                     for r in RATIOS}})
    for name, table in tables.items():
        if name == "reference" or args.no_ppl:
            continue
        for ratio in RATIOS:
            emit({"profiler": name.split("@")[0], "tokens": table.meta["tokens"], "ratio": ratio, "dataset": "wikitext2",
                  "seq_len": SEQ_LEN, "windows": args.windows, "ppl": study.ppl(table, ratio)})


@torch.inference_mode()
def layers(args: argparse.Namespace, emit) -> None:  # type: ignore[no-untyped-def]
    """Reference vs batched exact profiler on a few start layers, same options, same tokens, in turn."""
    from gapprune.engine.masks import masked_units
    from gapprune.engine.replay import replay_metric
    from gapprune.options import kept_units
    from gapprune.profiling.loss_table import option_grid

    tokens = args.tokens[0]
    study = Study(args, tokens // SEQ_LEN)
    inputs, adapter, device = study.prefix(tokens), study.adapter, study.device
    grid = option_grid(adapter, study.step, MLP_STRIDE)
    reference = dense_reference(adapter, inputs, "kl", device)
    for layer in args.layers:
        start = time.perf_counter()
        replay_metric(adapter, inputs, layer, "kl", reference, device)  # the base
        for c in COMPONENTS:
            for k in grid.measured[c][1:]:
                with masked_units(adapter, layer, c, kept_units(study.scores, adapter, layer, c, grid.options[c][k])):
                    replay_metric(adapter, inputs, layer, "kl", reference, device)
        reference_s = time.perf_counter() - start
        start = time.perf_counter()
        build_loss_table_batched(adapter, inputs, study.scores, channel_step=study.step, mlp_stride=MLP_STRIDE, layers=[layer],
                                 max_rows=args.max_rows, progress=False)
        emit({"kind": "layer_timing", "tokens": tokens, "layer": layer,
              "options": sum(len(v) - 1 for v in grid.measured.values()), "reference_s": round(reference_s, 2),
              "batched_s": round(time.perf_counter() - start, 2)})


def calib(args: argparse.Namespace, emit) -> None:  # type: ignore[no-untyped-def]
    sizes = sorted(args.tokens)
    study = Study(args, sizes[-1] // SEQ_LEN)
    tables: dict[tuple[str, int], LossTable] = {}
    for tokens in sizes:
        for profiler in ("exact", "fisher"):
            start = time.perf_counter()
            tables[(profiler, tokens)] = study.exact(tokens) if profiler == "exact" else study.fisher(tokens)
            synchronize(study.device)
            emit({"kind": "calib_time", "profiler": profiler, "tokens": tokens, "wall_s": round(time.perf_counter() - start, 2)})
    if args.bf16:
        start = time.perf_counter()
        tables[("exact-bf16", args.bf16)] = study.exact(args.bf16, precision="bfloat16")
        emit({"kind": "calib_time", "profiler": "exact-bf16", "tokens": args.bf16, "wall_s": round(time.perf_counter() - start, 2)})
    largest = tables[("exact", sizes[-1])]
    for (profiler, tokens), table in tables.items():
        row: dict[str, Any] = {"kind": "calib", "profiler": profiler, "tokens": tokens,
                               "spearman_vs_largest_exact": rank_correlation(largest, table)}
        if profiler == "exact-bf16":
            row["spearman_vs_float32_same_tokens"] = rank_correlation(tables[("exact", tokens)], table)
        for ratio in RATIOS:
            choice = study.plan_choice(table, ratio)
            row[f"plan_agreement_{ratio}"] = agreement(study.plan_choice(largest, ratio), choice)
            if profiler == "exact-bf16":
                row[f"same_plan_as_float32_{ratio}"] = choice == study.plan_choice(tables[("exact", tokens)], ratio)
            row[f"ppl_{ratio}"] = study.ppl(table, ratio)
        row.update({"dataset": "wikitext2", "seq_len": SEQ_LEN, "windows": args.windows})
        emit(row)
    if args.save_tables:
        for (profiler, tokens), table in tables.items():
            table.save(Path(args.save_tables) / f"table_{profiler}_{tokens}.json")


def run_prune(model: str, ratio: float, out: Path, profiler: str, data_dir: str | None, *extra: str) -> dict[str, float]:
    """Wall and CPU seconds of one `gapprune prune` process."""
    command = [sys.executable, "-m", "gapprune", "prune", model, "--ratio", str(ratio), "--out", str(out), "--overwrite",
               "--no-plots", "--profiler", profiler, *extra]
    env = {**os.environ, **({"GAPPRUNE_DATA": data_dir} if data_dir else {})}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, check=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "load_1min": round(os.getloadavg()[0], 2)}


def full_replays(table: LossTable) -> int:
    """Replays of the exact profiler's grid (its measured options, nothing-removed excluded)."""
    stride = int(table.meta.get("mlp_stride", 1))
    attn = table.n_layers * (len(table.options["attn"]) - 1)
    n_mlp = len(table.options["mlp"])
    mlp_grid = len(set(range(0, n_mlp, stride)) | {n_mlp - 1}) - 1
    return attn + table.n_layers * mlp_grid


def exact_replays(table: LossTable) -> int:
    """Exact entries measured, nothing-removed options excluded (they are exactly 0 without a replay)."""
    assert table.exact is not None
    return sum(int(table.exact[c][:, 1:].sum()) for c in table.exact)


def auto(args: argparse.Namespace, emit) -> None:  # type: ignore[no-untyped-def]
    """`gapprune prune` with --profiler auto and exact per ratio, timed end to end; both plans' perplexity."""
    runs = Path(args.runs)
    exact_profile: tuple[Path, float] | None = None
    folders: dict[tuple[str, float], Path] = {}
    timing: dict[tuple[str, float], dict[str, float]] = {}
    for ratio in map(float, args.ratios.split(",")):
        auto_dir = runs / f"auto_{ratio}"
        timing[("auto", ratio)] = run_prune(args.model, ratio, auto_dir, "auto", args.data_dir)
        exact_dir = runs / f"exact_{ratio}"
        if args.exact_table:
            profile_dir = runs / f"exact_profile_{ratio}"
            shutil.rmtree(profile_dir, ignore_errors=True)
            profile_dir.mkdir(parents=True)
            for name in ("profile.json", "scores.json", "signals.json"):
                shutil.copyfile(auto_dir / name, profile_dir / name)
            shutil.copyfile(args.exact_table, profile_dir / "loss_table.json")
            table_s = float(json.loads(Path(args.exact_table).read_text())["meta"]["wall_s"])
            measured = run_prune(args.model, ratio, exact_dir, "exact", args.data_dir, "--profile", str(profile_dir))
            timing[("exact", ratio)] = {**measured, "wall_s": round(measured["wall_s"] + table_s, 1),
                                        "profiling_reused_s": table_s}
        elif exact_profile is None or not args.reuse_exact:
            timing[("exact", ratio)] = run_prune(args.model, ratio, exact_dir, "exact", args.data_dir)
            table_s = json.loads((exact_dir / "profile.json").read_text())["timings"]["profiling"]
            exact_profile = (exact_dir, table_s)
        else:
            measured = run_prune(args.model, ratio, exact_dir, "exact", args.data_dir, "--profile", str(exact_profile[0]))
            timing[("exact", ratio)] = {**measured, "wall_s": round(measured["wall_s"] + exact_profile[1], 1),
                                        "profiling_reused_s": exact_profile[1]}
        folders[("auto", ratio)], folders[("exact", ratio)] = auto_dir, exact_dir
    ppl: dict[tuple[str, float], float] = {}
    for key, folder in folders.items():
        model, tokenizer = load(str(folder))
        ppl[key] = perplexity(model, tokenizer, Window("wikitext2", 128, args.windows), args.data_dir)["ppl"]
    for (profiler, ratio), folder in folders.items():
        table = LossTable.load(folder / "loss_table.json")
        meta = table.meta.get("auto", {}) if profiler == "auto" else {}
        emit({"kind": "auto_vs_exact", "profiler": profiler, "ratio": ratio, **timing[(profiler, ratio)],
              "exact_replays": exact_replays(table), "full_replays": full_replays(table),
              "ppl": round(ppl[(profiler, ratio)], 3), "ppl_exact": round(ppl[("exact", ratio)], 3),
              "dataset": "wikitext2", "seq_len": 128, "windows": args.windows, "estimate": meta.get("estimate_profiler"),
              "margin": meta.get("margin"), "rounds": meta.get("rounds")})


def screen(args: argparse.Namespace, emit) -> None:  # type: ignore[no-untyped-def]
    """The CLI's defaults: the exact table timed, then `auto` per variant (screen precision:stride) and
    ratio from fresh checkpoints; every plan scored by its summed ΔL on that one exact table."""
    import tempfile
    from dataclasses import replace

    from gapprune.config import PruneConfig
    from gapprune.pipeline import calibrate
    from gapprune.profiling.profilers import measure_table

    torch.set_num_threads(args.threads)
    model, tokenizer = load(args.model)
    config = PruneConfig(ratio=0.25, data_dir=args.data_dir)
    calibration = calibrate(model, tokenizer, config)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        exact = measure_table(calibration, replace(config, profiler="exact"), Path(folder))
    exact_s = round(time.perf_counter() - start, 1)
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
                  "exact_replays": exact_replays(profile.table), "rounds": meta["rounds"],
                  "note": "wall_s and exact_wall_s: profiling alone (plan_for's phase; the exact table's measure_table)"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["timing", "calib", "layers", "auto", "screen"])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tokens", type=lambda s: [int(x) for x in s.split(",")], default=[1024])
    parser.add_argument("--fisher-tokens", type=int, default=4096, help="timing: also time Fisher on this many tokens")
    parser.add_argument("--bf16", type=int, default=0, help="calib: also profile this many tokens under bf16 autocast")
    parser.add_argument("--windows", type=int, default=256, help="WikiText-2 test windows (x 128) for perplexity")
    parser.add_argument("--max-rows", type=int, default=4096, help="stacked tokens per batched pass")
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--layers", type=lambda s: [int(x) for x in s.split(",")], default=[0, 15, 29],
                        help="layers: start layers to time both exact profilers on")
    parser.add_argument("--no-ppl", action="store_true", help="timing: skip the perplexity of the plans")
    parser.add_argument("--save-tables", default=None, help="calib: folder to save every table in")
    parser.add_argument("--ratios", default="0.125,0.25,0.375,0.5", help="auto: ratios to prune at")
    parser.add_argument("--runs", default="runs/auto_bench", help="auto: where the pruned folders go")
    parser.add_argument("--reuse-exact", action=argparse.BooleanOptionalAction, default=True,
                        help="auto: profile exactly once, reuse the folder for the other ratios")
    parser.add_argument("--exact-table", default=None, help="auto: an exact loss_table.json of this model and settings")
    parser.add_argument("--variants", default="float32:1", help="screen: screen precision:stride, comma-separated")
    parser.add_argument("--threads", type=int, default=2, help="screen: torch threads")
    parser.add_argument("--out", default="docs/results/performance.json")
    args = parser.parse_args()
    log = ResultLog(args.out, args.device)
    {"timing": timing, "calib": calib, "layers": layers, "auto": auto, "screen": screen}[args.mode](args, log.emit)


if __name__ == "__main__":
    main()
