"""The README's main job, timed on this machine with its printed lines and the machine's speed beside it.

    python benchmarks/main_job.py --out docs/results/main_job.json

Runs `gapprune <readme.MAIN_JOB>` as a user would (a fresh process, the data folder from
$GAPPRUNE_DATA), then `gapprune bench smollm2-135m --batches 1`, so `wall_s × 684 / prefill_ms`
compares runs across machines and loads. The record carries the last printed lines the README shows.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import GAPPRUNE, ResultLog, bf16_flags, parser
from readme import MAIN_JOB


def prefill_ms() -> float:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "bench.json"
        subprocess.run([GAPPRUNE, "bench", "smollm2-135m", "--batches", "1", "--out", str(out)], check=True,
                       capture_output=True)
        return float(json.loads(out.read_text())[0]["prefill_ms"])


def main() -> None:
    p = parser(__doc__, out="docs/results/main_job.json")
    p.add_argument("--code", default="", help="the commit measured")
    args = p.parse_args()
    if "GAPPRUNE_DATA" not in os.environ:
        raise SystemExit("set GAPPRUNE_DATA to the data folder, as the README's command does")
    start = time.perf_counter()
    done = subprocess.run([GAPPRUNE, *shlex.split(MAIN_JOB)], check=True, capture_output=True, text=True)
    wall = time.perf_counter() - start
    printed = [line for line in done.stdout.splitlines() if line.strip()]
    out = Path(shlex.split(MAIN_JOB)[shlex.split(MAIN_JOB).index("--out") + 1])
    run = json.loads((out / "run.json").read_text())
    plan = json.loads((out / "plan.json").read_text())
    screen = json.loads((out / "loss_table.json").read_text())["meta"]
    speed = prefill_ms()
    ResultLog(args.out).emit({
        "kind": "main_job", "model": "smollm2-135m", "ratio": 0.25, "code": args.code,
        "job": f"GAPPRUNE_DATA=../shared/data gapprune {MAIN_JOB}", "wall_s": round(wall, 1),
        "phases": run["phases"], "peak_rss_mb": run.get("peak_rss_mb"), "run_machine": run["machine"],
        "printed": printed, "prefill_ms": speed, "normalised_s": round(wall * 684 / speed, 1),
        "calib": plan["config"]["calib"], "plan_check": plan["summary"].get("plan_check"),
        "screen": {"precision": screen.get("precision"), "wall_s": screen.get("wall_s")},
        "cpu_flags": bf16_flags(),
    })


if __name__ == "__main__":
    main()
