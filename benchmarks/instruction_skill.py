"""What SmolLM2-135M-Instruct's users look at: instruction perplexity beside WikiText-2, by calibration text.

    GAPPRUNE_DATA=../shared/data python benchmarks/instruction_skill.py --out docs/results/skills.json

The dense model, the README job's folder (`--ratio 0.25`, calibrated on WikiText-2) and the same command
calibrated on instructions (`--calib alpaca`: the Alpaca set's train rows) are measured by `gapprune ppl` on
the Alpaca set's 500 held-out rows (the whole evaluation split, windows of 128 tokens) and on the first 256
windows of 128 tokens of the WikiText-2 test; one `skill_ppl` record per model and data set. The
instruction-calibrated folder is pruned again unless its `run.json` already records that command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import GAPPRUNE, ResultLog, parser, pruned_by
from readme import MAIN_JOB

PRUNED = {"wikitext2": "runs/smollm2-gap-25", "alpaca": "runs/smollm2-gap-25-alpaca"}
EVALUATIONS = {"alpaca": [], "wikitext2": ["--max-windows", "256"]}


def perplexity(model: str, dataset: str) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "ppl.json"
        subprocess.run([GAPPRUNE, "ppl", model, "--dataset", dataset, "--seq-len", "128", *EVALUATIONS[dataset],
                        "--json", str(out)], check=True, capture_output=True)
        found = json.loads(out.read_text())
        return found[0] if isinstance(found, list) else found


def alpaca_prune() -> list[str]:
    """The README job's command with the instruction calibration, its own folder and no evaluation."""
    words = MAIN_JOB.split()
    words = words[: words.index("--eval")] + words[words.index("--eval-windows") + 2:]
    return [PRUNED["alpaca"] if w == PRUNED["wikitext2"] else w for w in words] + ["--calib", "alpaca"]


def main() -> None:
    p = parser(__doc__, out="docs/results/skills.json")
    args = p.parse_args()
    if "GAPPRUNE_DATA" not in os.environ:
        raise SystemExit("set GAPPRUNE_DATA to the data folder")
    if not Path(PRUNED["wikitext2"], "plan.json").is_file():
        raise SystemExit(f"{PRUNED['wikitext2']} is missing: run the README's main job first")
    if not pruned_by(PRUNED["alpaca"], alpaca_prune()):
        subprocess.run([GAPPRUNE, *alpaca_prune()], check=True, capture_output=True)
    log = ResultLog(args.out)
    for model, method, calibration in [("smollm2-135m", "dense", None), *((f, "gap", c) for c, f in PRUNED.items())]:
        for dataset in EVALUATIONS:
            result = perplexity(model, dataset)
            log.emit({"kind": "skill_ppl", "model": "smollm2-135m", "method": method,
                      "ratio": 0.0 if method == "dense" else 0.25, "ratio_of": "model", "calibration": calibration,
                      "folder": model, "dataset": dataset, "seq_len": 128, "windows": result.get("windows"),
                      "ppl": result["ppl"], "prune_command": {"wikitext2": f"gapprune {MAIN_JOB}", "alpaca":
                                                              "gapprune " + " ".join(alpaca_prune())}.get(calibration)})


if __name__ == "__main__":
    main()
