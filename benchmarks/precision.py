"""Precision study: the default prune of SmolLM2 at 25% from bfloat16 weights vs float32, on this CPU.

Each dtype runs the CLI in a child process under `/usr/bin/time -v` (peak RSS, wall). The plans are
then compared on one float32 loss table (the float32 run's; entries the bfloat16 plan picks that
the `auto` profiler left estimated are measured exactly first), so `summed_dl_exact` is
Σ exact float32 ΔL of each plan's options. Writes docs/results/precision.json.

    python benchmarks/precision.py --out docs/results/precision.json [--windows 256]
    # on a GPU, against the float32 CPU run's folder (benchmarks/gpu_check.sh):
    python benchmarks/precision.py --device cuda --dtypes bfloat16 --reference runs/precision/float32 --out F
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

MODEL, RATIO = "smollm2-135m", 0.25


def run_prune(dtype: str, out: Path, windows: int, device: str = "cpu", model: str = MODEL) -> dict:
    """The CLI's default prune in `dtype`; peak RSS (MB) from /usr/bin/time -v (run.json's where it is
    missing) and wall seconds."""
    argv = [sys.executable, "-m", "gapprune", "prune", model, "--ratio", str(RATIO), "--dtype", dtype,
            "--device", device, "--out", str(out), "--overwrite", "--no-plots", "--eval", "wikitext2",
            "--eval-windows", str(windows)]
    timer = ["/usr/bin/time", "-v"] if Path("/usr/bin/time").is_file() else []  # not on every GPU image
    start = time.perf_counter()
    done = subprocess.run([*timer, *argv], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    run_record = json.loads((out / "run.json").read_text())
    found = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    peak_mb = round(int(found.group(1)) / 1024, 1) if found else run_record.get("peak_rss_mb")
    evaluation = json.loads((out / "eval.json").read_text())
    ppl = next(r["ppl"] for r in evaluation if r["model"] == "pruned")
    dense = next(r["ppl"] for r in evaluation if r["model"] == "dense")
    return {"model": model, "dtype": dtype, "device": device, "ratio": RATIO, "ppl": ppl, "dense_ppl": dense,
            "peak_rss_mb": peak_mb, "wall_s": round(wall, 1), "command": " ".join([*timer, "python", *argv[1:]]),
            "timings": json.loads((out / "profile.json").read_text()).get("timings", {}),
            "peak_rss_mb_after": run_record.get("peak_rss_mb_after", {})}


def summed_exact_losses(folders: dict[str, Path], device: str = "cpu", model: str = MODEL) -> dict[str, float]:
    """Σ exact float32 ΔL of each folder's plan, on the float32 folder's table (missing entries measured)."""
    import numpy as np

    from gapprune.api import load
    from gapprune.config import PruneConfig
    from gapprune.engine.head import dense_reference
    from gapprune.engine.replay import dense_base, measure_entries
    from gapprune.pipeline import Profile, calibrate
    from gapprune.profiling.loss_table import units_of
    from gapprune.prune.plan import Plan

    reference_folder = folders["float32"]
    profile = Profile.load(reference_folder)
    table = profile.table
    plans = {dtype: Plan.load(folder / "plan.json") for dtype, folder in folders.items()}
    picks = {dtype: [(lp.layer, c, lp.component(c).option) for lp in plan.layers for c in ("attn", "mlp")]
             for dtype, plan in plans.items()}
    index = {c: {tuple(o): i for i, o in enumerate(table.options[c])} for c in ("attn", "mlp")}
    missing: dict[int, dict[str, list[int]]] = {}
    for rows in picks.values():
        for layer, c, option in rows:
            k = index[c][tuple(option)]
            if not table.exact[c][layer, k]:
                missing.setdefault(layer, {}).setdefault(c, []).append(k)
    if missing:
        config = PruneConfig(**{**plans["float32"].config, "dtype": "float32"})
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False  # the reference table is float32, as on the CPU
        loaded, tokenizer = load(model, dtype="float32", device=device)
        calibration = calibrate(loaded, tokenizer, replace(config, device=device))
        adapter, inputs = calibration.adapter, calibration.profile_inputs
        reference = dense_reference(adapter, inputs, config.metric, torch.device(device))
        base = dense_base(adapter, inputs, reference, config.metric, torch.device(device))
        measured = measure_entries(adapter, inputs,
                                   {layer: {c: sorted(set(ks)) for c, ks in per.items()} for layer, per in missing.items()},
                                   units_of(adapter, profile.scores, table.options),
                                   metric=config.metric, reference=reference, base=base)
        for layer, per in measured.items():
            for c, values in per.items():
                for k, value in values.items():
                    table.loss[c][layer, k], table.exact[c][layer, k] = value, True
    return {dtype: float(np.sum([table.loss[c][layer, index[c][tuple(o)]] for layer, c, o in rows]))
            for dtype, rows in picks.items()} | {"measured_extra": sum(len(k) for per in missing.values() for k in per.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/results/precision.json")
    parser.add_argument("--runs", default="runs/precision")
    parser.add_argument("--windows", type=int, default=256, help="WikiText-2 test windows of 128 tokens")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default=MODEL, help="alias, folder or GGUF file (default: the embedded SmolLM2)")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="dtypes to prune in (comma-separated)")
    parser.add_argument("--reference", default=None,
                        help="an earlier float32 run's folder (e.g. the CPU one): its plan and table are the reference")
    args = parser.parse_args()
    folders = {dtype: Path(args.runs) / f"{dtype}-{args.device.replace(':', '')}" for dtype in args.dtypes.split(",")}
    records = [run_prune(dtype, folder, args.windows, args.device, args.model) for dtype, folder in folders.items()]
    if args.reference:
        folders = {"float32": Path(args.reference), **{d: f for d, f in folders.items() if d != "float32"}}
        records.insert(0, {"dtype": "float32", "folder": args.reference, "role": "reference plan and table"})
    sums = summed_exact_losses(folders, args.device, args.model)
    for record in records:
        record["summed_dl_exact"] = sums[record["dtype"]]
    f32, other = records[0], records[-1]
    summary = {"kind": "comparison", "dl_ratio": other["summed_dl_exact"] / f32["summed_dl_exact"],
               "extra_exact_entries_measured": sums["measured_extra"],
               "ppl_protocol": f"WikiText-2 test, first {args.windows} windows of 128 tokens, no BOS"}
    if "ppl" in f32:
        summary |= {"ppl_ratio": other["ppl"] / f32["ppl"], "rss_ratio": other["peak_rss_mb"] / f32["peak_rss_mb"]}
    Path(args.out).write_text(json.dumps([*records, summary], indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
