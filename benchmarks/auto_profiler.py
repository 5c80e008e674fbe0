"""`--profiler auto` against `--profiler exact` on SmolLM2-135M: wall time, exact replays, plan quality.

For each ratio, the README's command (`gapprune prune smollm2-135m --ratio R --out DIR`, no --eval:
profile + DP + surgery + compensation + save) is timed end to end as a user runs it, once with
`--profiler auto` and once with `--profiler exact`. The exact table does not depend on the ratio,
so with `--reuse-exact` only the first ratio profiles exactly and the others time the same command
with `--profile` pointing at that folder, adding the measured profiling time (said in the record).
`--exact-table FILE` takes an exact loss_table.json measured before (same model and settings):
each auto run's profile folder gets it in place of its own table, and the exact plan is pruned
from there (`--profile`), its profiling time taken from the table's own `wall_s`.
Then both plans' WikiText-2 perplexity (first 256 windows of 128 tokens) is measured.

    python benchmarks/auto_profiler.py --data-dir ../shared/data --out docs/results/performance.json
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import RATIOS, ResultLog, Window, parser

from gapprune.allocate import LossTable


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


def main() -> None:
    p = parser(__doc__, "docs/results/performance.json")
    p.add_argument("--ratios", default=",".join(map(str, RATIOS)))
    p.add_argument("--runs", default="runs/auto_bench")
    p.add_argument("--reuse-exact", action=__import__("argparse").BooleanOptionalAction, default=True)
    p.add_argument("--windows", type=int, default=Window("wikitext2").windows)
    p.add_argument("--exact-table", default=None, help="an exact loss_table.json of this model and settings")
    args = p.parse_args()
    log = ResultLog(args.out)
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

    from gapprune.api import load
    from gapprune.evaluate.perplexity import evaluate_ppl

    ppl: dict[tuple[str, float], float] = {}
    for key, folder in folders.items():
        model, tokenizer = load(str(folder))
        ppl[key] = evaluate_ppl(model, tokenizer, "wikitext2", seq_len=128, max_windows=args.windows,
                                data_dir=args.data_dir).ppl
    for (profiler, ratio), folder in folders.items():
        table = LossTable.load(folder / "loss_table.json")
        log.emit({"kind": "auto_vs_exact", "profiler": profiler, "ratio": ratio, **timing[(profiler, ratio)],
                  "exact_replays": exact_replays(table), "full_replays": full_replays(table),
                  "ppl": round(ppl[(profiler, ratio)], 3), "ppl_exact": round(ppl[("exact", ratio)], 3),
                  "dataset": "wikitext2", "seq_len": 128, "windows": args.windows,
                  "estimate": table.meta.get("auto", {}).get("estimate_profiler") if profiler == "auto" else None,
                  "margin": table.meta.get("auto", {}).get("margin") if profiler == "auto" else None,
                  "rounds": table.meta.get("auto", {}).get("rounds") if profiler == "auto" else None})


if __name__ == "__main__":
    main()
