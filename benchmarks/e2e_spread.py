"""The spread of the real-model end-to-end prune's perplexity over calibration seeds, for its test's tolerance.

    GAPPRUNE_DATA=../shared/data python benchmarks/e2e_spread.py --out docs/results/e2e_spread.json

Runs `gapprune prune` with the arguments of `tests/test_real_model.py::test_prune_command_end_to_end_with_gap`
(`E2E_ARGS`) at seeds 0-4 as a user runs it. The test prunes at seed 0 and holds its perplexity to this
record's seed-0 value within three standard deviations of the log perplexity over seeds: a change that moves the
result more than drawing other calibration windows does fails it.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import GAPPRUNE, ResultLog, parser

E2E_ARGS = ["prune", "smollm2-135m", "--ratio", "0.2", "--calib-samples", "4", "--profile-samples", "1",
            "--batch-size", "1", "--seq-len", "64", "--mlp-stride", "32", "--eval", "wikitext2", "--eval-windows", "8"]
SEEDS = range(5)


def pruned_ppl(seed: int, data_dir: str) -> float:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "pruned"
        subprocess.run([GAPPRUNE, *E2E_ARGS, "--seed", str(seed), "--out", str(out), "--data-dir", data_dir],
                       check=True, capture_output=True)
        return float(json.loads((out / "eval.json").read_text())[1]["ppl"])


def main() -> None:
    args = parser(__doc__, out="docs/results/e2e_spread.json").parse_args()
    data_dir = args.data_dir or os.environ.get("GAPPRUNE_DATA")
    if not data_dir:
        raise SystemExit("set GAPPRUNE_DATA or --data-dir to the data folder")
    ppl = {seed: pruned_ppl(seed, data_dir) for seed in SEEDS}
    logs = [math.log(v) for v in ppl.values()]
    ResultLog(args.out).emit({
        "kind": "e2e_spread", "model": "smollm2-135m", "args": E2E_ARGS, "ppl_by_seed": ppl,
        "log_ppl_std": statistics.stdev(logs), "tolerance_log": 3 * statistics.stdev(logs),
    })


if __name__ == "__main__":
    main()
