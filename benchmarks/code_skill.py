"""A code model's skill by calibration text: Qwen2.5-Coder-1.5B at 25% of its decoder, HumanEval and perplexity.

    GAPPRUNE_VLLM_PYTHON=.venv-vllm/bin/python GAPPRUNE_DATA=../shared/data \
        python benchmarks/code_skill.py --calibrations wikitext2,c4,self,code+wikitext2 --out docs/results/skills.json

For each calibration the model is pruned with the CLI's defaults otherwise (`--ratio 0.25 --ratio-of decoder`,
in memory, `--offload off`, as `auto` chooses on a machine with nothing else running;
the calibration the CLI picks for this model unasked, `code`, is left out of its command) into
`runs/qwen15-gap-25-<calibration>` (`--prune-options '--calib-samples 128'` adds options to every prune and their
words to the folder's name), unless that folder's `run.json` already records the command; then
`gapprune eval --tasks humaneval --generation vllm` gives greedy pass@1 on the 164 problems, and `gapprune ppl`
the perplexity on the first 64 windows of 128 tokens of the held-out Python source (`code`) and of the
WikiText-2 test (the dense model's too, once, as `skill_ppl` records). One `skill` record per calibration (pass@1,
the fraction of dense, both perplexities and the prune's ΔL check), written as soon as it is measured, so a stopped
sweep keeps what it finished.
On two cores each calibration costs about half an hour of pruning and 10 to 60 minutes of HumanEval
(longest for a prune whose answers run on to the token limit).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import GAPPRUNE, ResultLog, parser, pruned_by

MODEL = "qwen2.5-coder-1.5b"
PERPLEXITY_SETS = ("code", "wikitext2")
GENERATION = ("vllm 0.32.0 (CPU build) through gapprune's plugin, float32, greedy, plain completion of the prompt, "
              "max 384 new tokens, stop at the HumanEval stop sequences")


def folder(calibration: str, options: list[str]) -> str:
    suffix = "".join(f"-{word.lstrip('-')}" for word in options)
    return f"runs/qwen15-gap-25-{calibration.replace('+', '-')}{suffix}"


def prune_command(calibration: str, options: list[str]) -> list[str]:
    from gapprune.data.domain import default_calibration

    asked = [] if calibration == default_calibration(MODEL, None, code_available=True).calib else ["--calib", calibration]
    # in memory whatever else the machine runs: `--offload auto` would stream the model when another process holds
    # memory, and a streamed model is profiled by the exact layer-major profiler, not the in-memory default's
    return ["prune", MODEL, "--ratio", "0.25", "--ratio-of", "decoder", *asked, *options,
            "--offload", "off", "--out", folder(calibration, options), "--overwrite", "--no-plots"]


def read_json_output(command: list[str]) -> Any:
    """Run a gapprune command whose last word is its JSON output flag, and return what it wrote there."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "out.json"
        subprocess.run([GAPPRUNE, *command, str(out)], check=True)
        return json.loads(out.read_text())


def humaneval(model: str) -> dict:
    found = read_json_output(["eval", model, "--ppl", "", "--tasks", "humaneval", "--generation", "vllm", "--out"])
    return next(r for r in found if r["task"] == "humaneval")


def perplexity(model: str, dataset: str) -> float:
    found = read_json_output(["ppl", model, "--dataset", dataset, "--seq-len", "128", "--max-windows", "64",
                              "--json"])
    return float((found[0] if isinstance(found, list) else found)["ppl"])


def prune_summary(model: str) -> dict:
    run = json.loads(Path(model, "run.json").read_text())
    summary = json.loads(Path(model, "plan.json").read_text())["summary"]
    check = summary.get("plan_check", {})
    return {"command": run["command"], "params_removed": summary["params_removed"],
            "decoder_ratio": summary.get("decoder_ratio"), "model_ratio": summary["achieved_ratio"],
            "predicted_dL": check.get("predicted"), "measured_dL_masked": check.get("measured_masked"),
            "measured_dL_saved": check.get("measured_saved"), "wall_s": run["wall_s"]}


def dense_pass_rate(log: ResultLog) -> float | None:
    found = [r["value"] for r in log.records if r.get("kind") == "skill" and r.get("model") == MODEL
             and r.get("method") == "dense" and r.get("task") == "humaneval"]
    return found[-1] if found else None


def main() -> None:
    p = parser(__doc__, out="docs/results/skills.json")
    p.add_argument("--calibrations", default="wikitext2,c4,self,code+wikitext2",
                   help="comma-separated --calib values ('code' is the CLI's own choice for this model)")
    p.add_argument("--prune-options", default="",
                   help="further `gapprune prune` options for every calibration, e.g. '--calib-samples 128' "
                        "(they name the folder and are recorded)")
    args = p.parse_args()
    options = shlex.split(args.prune_options)
    if "GAPPRUNE_DATA" not in os.environ and not args.data_dir:
        raise SystemExit("set GAPPRUNE_DATA (or --data-dir) to the data folder")
    if args.data_dir:
        os.environ["GAPPRUNE_DATA"] = args.data_dir
    log = ResultLog(args.out)
    dense = dense_pass_rate(log)
    for name in PERPLEXITY_SETS:  # the dense model's, once, for the pruned ones to be read against
        if not log.done(kind="skill_ppl", model=MODEL, method="dense", dataset=name, windows=64):
            log.emit({"kind": "skill_ppl", "model": MODEL, "method": "dense", "ratio": 0.0, "ratio_of": "decoder",
                      "calibration": None, "folder": MODEL, "dataset": name, "seq_len": 128, "windows": 64,
                      "ppl": perplexity(MODEL, name)})
    for calibration in args.calibrations.split(","):
        model = folder(calibration, options)
        if not pruned_by(model, prune_command(calibration, options)):
            subprocess.run([GAPPRUNE, *prune_command(calibration, options)], check=True)
        result = humaneval(model)
        log.emit({"kind": "skill", "model": MODEL, "method": "gap", "ratio": 0.25, "ratio_of": "decoder",
                  "calibration": calibration, "prune_options": options, "task": "humaneval", "metric": "pass@1", "value": result["value"],
                  "passed": result["passed"], "n": result["n"],
                  "relative_to_dense": round(result["value"] / dense, 4) if dense else None,
                  "perplexity_64x128": {name: perplexity(model, name) for name in PERPLEXITY_SETS},
                  "generation": GENERATION, "prune": prune_summary(model)})


if __name__ == "__main__":
    main()
