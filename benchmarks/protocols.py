"""Perplexity under the literature's protocols, for the table a reader sets beside the papers'.

    python benchmarks/protocols.py --models runs/smollm2-gap-25 --protocols llm-pruner,slicegpt \
        --out docs/results/protocols.json

Each model is measured by `gapprune ppl MODEL --protocol P` (whole test sets, the protocol's window
length) in a fresh process; records carry the protocol, the model and its plan's ratio and allocator.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import GAPPRUNE, ResultLog, parser


def plan_label(model: str) -> dict:
    """What a pruned folder is: its plan's allocator, ratio and calibration (a dense model: none)."""
    plan = Path(model) / "plan.json"
    if not plan.is_file():
        return {"allocator": "dense", "target_ratio": 0.0}
    data = json.loads(plan.read_text())
    return {"allocator": data["summary"]["allocator"], "target_ratio": data["config"].get("ratio"),
            "ratio_of": data["config"].get("ratio_of"), "achieved_ratio": data["summary"]["achieved_ratio"],
            "calibration": data["config"].get("calib"), "compensate": data["config"].get("compensate"),
            "criterion": data["config"].get("criterion")}


def main() -> None:
    p = parser(__doc__, out="docs/results/protocols.json")
    p.add_argument("--models", required=True, help="comma-separated folders or aliases")
    p.add_argument("--protocols", default="llm-pruner,slicegpt")
    p.add_argument("--name", default="smollm2-135m", help="the base model's name in the records")
    args = p.parse_args()
    log = ResultLog(args.out)
    for model in args.models.split(","):
        for protocol in args.protocols.split(","):
            with tempfile.TemporaryDirectory() as folder:
                out = Path(folder) / "ppl.json"
                start = time.perf_counter()
                subprocess.run([GAPPRUNE, "ppl", model, "--protocol", protocol, "--json", str(out),
                                *(["--data-dir", args.data_dir] if args.data_dir else [])], check=True)
                wall = time.perf_counter() - start
                written = json.loads(out.read_text())
            for record in written if isinstance(written, list) else [written]:
                log.emit({"kind": "protocol", **record, "model": args.name, "folder": model, **plan_label(model),
                          "process_wall_s": round(wall, 1)})


if __name__ == "__main__":
    main()
