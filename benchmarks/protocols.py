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

A task too long for one core (HellaSwag in full: 40,168 requests, hours on a CPU core) runs as N shards at once,
each in its own process, `--keep` folder and core, on the items whose index is K mod N; `--merge` then adds the
whole-set record of every task whose N shards are all in `--out` (the item-weighted mean: each metric is a mean
over items):

    for K in 0 1; do taskset -c $K python benchmarks/protocols.py --zeroshot --models runs/smollm2-owl-50 \
        --tasks hellaswag --shard $K/2 --keep runs/zs-shard$K --out runs/hs.json & done; wait
    python benchmarks/protocols.py --merge --models runs/smollm2-owl-50 --out runs/hs.json
"""

from __future__ import annotations

import argparse
import json
import math
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


def zeroshot(model: str, keep: Path, data_dir: str | None, tasks: list[str],
             shard: tuple[int, int] | None = None) -> list[dict]:
    """The tasks in full (or one `shard` of their items) for one model, a process per task; finished tasks are
    kept in `keep`."""
    records = []
    for task in tasks:
        suffix, items, task_data = "", None, data_dir
        if shard:
            suffix = f"-shard{shard[0]}of{shard[1]}"
            folder, items = shard_data(data_dir, task, *shard, keep / f"data{suffix}")
            task_data = str(folder)
        out = keep / f"{Path(model).name}-{task}{suffix}.json"
        command = [GAPPRUNE, "eval", model, "--ppl", "", "--tasks", task, "--out", str(out),
                   "--resume", str(keep / "requests"),
                   *(["--data-dir", task_data] if task_data else [])]
        wall = None
        if not out.is_file():
            start = time.perf_counter()
            subprocess.run(command, check=True)
            wall = round(time.perf_counter() - start, 1)
        for record in json.loads(out.read_text()):
            records.append({**record, "protocol": "llm-pruner", "process_wall_s": wall,
                            **({"shard": list(shard), "items": items} if shard else {}),
                            "task_command": "gapprune " + " ".join(repr(a) if a == "" else a for a in command[1:])})
    return records


def shard_data(data_dir: str | None, task: str, shard: int, shards: int, into: Path) -> tuple[Path, int]:
    """A data folder holding the task's items whose index is `shard` mod `shards`, and how many there are."""
    from gapprune.data.sources import data_dir as resolve_data_dir
    from gapprune.evaluate.zeroshot import TASKS as TASK_FILES

    root = resolve_data_dir(data_dir)
    if root is None:
        raise SystemExit("--shard reads the task's file from the data folder: set --data-dir or $GAPPRUNE_DATA")
    name = TASK_FILES[task].file
    rows = (root / "commonsense" / "lm-eval" / name).read_text(encoding="utf-8").splitlines()[shard::shards]
    path = into / "commonsense" / "lm-eval" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(row + "\n" for row in rows), encoding="utf-8")
    return into, len(rows)


def merge_shards(records: list[dict], folder: str) -> list[dict]:
    """The whole-set record of each task of `folder` whose shards (same date) are all in `records` and that has
    none yet: the item-weighted mean of the shards' values (each a mean over items of a 0/1 score), its stderr
    recomputed as lm-eval does (sample standard deviation over all items / sqrt(items))."""
    sets: dict[tuple[str, str], dict[int, dict]] = {}
    for r in records:
        if r.get("kind") == "protocol_zeroshot" and r.get("folder") == folder and "shard" in r:
            sets.setdefault((r["task"], r["date"]), {})[r["shard"][0]] = r
    whole = {(r["task"], r["date"]) for r in records if r.get("kind") == "protocol_zeroshot"
             and r.get("folder") == folder and "shard" not in r}
    merged = []
    for (task, day), shards in sorted(sets.items()):
        count = next(iter(shards.values()))["shard"][1]
        if (task, day) in whole or sorted(shards) != list(range(count)):
            continue
        parts = [shards[k] for k in range(count)]
        items = sum(p["items"] for p in parts)
        value = sum(p["value"] * p["items"] for p in parts) / items
        record = {k: v for k, v in parts[0].items() if k not in ("shard", "items", "date", "machine", "command")}
        record.update(value=value, stderr=math.sqrt(value * (1 - value) / (items - 1)), items=items, limit=None,
                      process_wall_s=max(p["process_wall_s"] or 0 for p in parts) or None,
                      task_command=" ; ".join(p["task_command"] for p in parts),
                      shards=[{"value": p["value"], "items": p["items"], "process_wall_s": p["process_wall_s"],
                               "command": p["command"]} for p in parts])
        merged.append(record)
    return merged


def main() -> None:
    p = parser(__doc__, out="docs/results/protocols.json")
    p.add_argument("--models", required=True, help="comma-separated folders or aliases")
    p.add_argument("--protocols", default="llm-pruner,slicegpt")
    p.add_argument("--name", default="smollm2-135m", help="the base model's name in the records")
    p.add_argument("--zeroshot", action="store_true", help="the 7 tasks in full instead of perplexity")
    p.add_argument("--keep", default="runs/zeroshot", help="folder of the per-task results and of what a stopped "
                   "run keeps to resume")
    p.add_argument("--tasks", default=",".join(TASKS), help="--zeroshot: the tasks (default: all 7)")
    p.add_argument("--shard", type=shard_spec, default=None, help="--zeroshot: K/N, only the items whose index is K "
                   "mod N (run the N shards at once, each with its own --keep, then --merge)")
    p.add_argument("--merge", action="store_true", help="add to --out the whole-set record of every task whose "
                   "shards are all in it")
    args = p.parse_args()
    log = ResultLog(args.out)
    if args.merge:
        for model in args.models.split(","):
            for record in merge_shards(log.records, model):
                log.emit(record)
        return
    if args.zeroshot:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
        for model in args.models.split(","):
            label = plan_label(model)
            for record in zeroshot(model, Path(args.keep), args.data_dir, args.tasks.split(","), args.shard):
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


def shard_spec(text: str) -> tuple[int, int]:
    """`K/N` with 0 <= K < N."""
    try:
        shard, shards = (int(part) for part in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard takes K/N, e.g. 0/2; got {text!r}") from None
    if not 0 <= shard < shards:
        raise argparse.ArgumentTypeError(f"--shard K/N needs 0 <= K < N; got {text!r}")
    return shard, shards


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
