"""Perplexity under the literature's protocols, for the table a reader sets beside the papers'.

    python benchmarks/protocols.py --models runs/smollm2-gap-25 --protocols llm-pruner,slicegpt \
        --out docs/results/protocols.json

Each model is measured by `gapprune ppl MODEL --protocol P` (whole test sets, the protocol's window
length) in a fresh process that keeps every scored window in `--keep` (`--resume`), so a stopped run
goes on where it stopped; each data set's record is written as soon as it is scored, with the protocol,
the model and its plan's ratio and allocator.
`--zeroshot` instead runs the llm-pruner protocol's 7 tasks without a limit, one task per process
(`gapprune eval MODEL --ppl '' --tasks T --out F`), so an interrupted run keeps every finished task:
with `--keep DIR` a task whose F already lies in DIR is recorded from it, not run again, and a task
stopped midway resumes from the requests answered so far (`gapprune eval --resume DIR/requests`).

    python benchmarks/protocols.py --zeroshot --models smollm2-135m,runs/smollm2-gap-25 --keep runs/zs \
        --out docs/results/protocols.json
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
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


TASKS = ("openbookqa", "arc_challenge", "winogrande", "piqa", "arc_easy", "boolq", "hellaswag")  # shortest first


def zeroshot(model: str, keep: Path, data_dir: str | None, tasks: list[str]) -> list[dict]:
    """The tasks in full for one model, a process per task; finished tasks are kept in `keep`."""
    records = []
    for task in tasks:
        out = keep / f"{Path(model).name}-{task}.json"
        command = [GAPPRUNE, "eval", model, "--ppl", "", "--tasks", task, "--out", str(out),
                   "--resume", str(keep / "requests"),
                   *(["--data-dir", data_dir] if data_dir else [])]
        wall = None
        if not out.is_file():
            start = time.perf_counter()
            subprocess.run(command, check=True)
            wall = round(time.perf_counter() - start, 1)
        for record in json.loads(out.read_text()):
            records.append({**record, "protocol": "llm-pruner", "process_wall_s": wall,
                            "task_command": "gapprune " + " ".join(repr(a) if a == "" else a for a in command[1:])})
    return records


def main() -> None:
    p = parser(__doc__, out="docs/results/protocols.json")
    p.add_argument("--models", required=True, help="comma-separated folders or aliases")
    p.add_argument("--protocols", default="llm-pruner,slicegpt")
    p.add_argument("--name", default="smollm2-135m", help="the base model's name in the records")
    p.add_argument("--zeroshot", action="store_true", help="the 7 tasks in full instead of perplexity")
    p.add_argument("--keep", default="runs/zeroshot", help="folder of the per-task results and of what a stopped "
                   "run keeps to resume")
    p.add_argument("--tasks", default=",".join(TASKS), help="--zeroshot: the tasks (default: all 7)")
    args = p.parse_args()
    log = ResultLog(args.out)
    if args.zeroshot:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
        for model in args.models.split(","):
            label = plan_label(model)
            for record in zeroshot(model, Path(args.keep), args.data_dir, args.tasks.split(",")):
                log.emit({"kind": "protocol_zeroshot", **record, "model": args.name, "folder": model,
                          "method": label["allocator"], "ratio": label["target_ratio"], **label})
        return
    for model in args.models.split(","):
        label = plan_label(model)
        for protocol in args.protocols.split(","):
            command = [GAPPRUNE, "ppl", model, "--protocol", protocol, "--resume", str(Path(args.keep) / "windows"),
                       *(["--data-dir", args.data_dir] if args.data_dir else [])]
            for record, wall in scored_sets(command):
                log.emit({"kind": "protocol", **record, "model": args.name, "folder": model, **label,
                          "method": label["allocator"], "process_wall_s": wall})


def scored_sets(command: list[str]) -> Iterator[tuple[dict, float]]:
    """Each data set's record as `gapprune ppl` prints it (one JSON line per set), with the process's time so
    far: a protocol of two sets stopped in the second keeps the first's record."""
    start = time.perf_counter()
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith("{"):
                yield json.loads(line), round(time.perf_counter() - start, 1)
            else:
                print(line, end="")
    if process.returncode:
        raise subprocess.CalledProcessError(process.returncode, command)

if __name__ == "__main__":
    main()
